"""`store-rollout replace STORE --mac NEW`: the store moved to a new box (a broken one swapped),
run in this process like `rollout` (the store-rollout deployment's `replace_box` parameter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from app.offline import Confirmed, Now, RequiredInventory
from app.runner import console, refuse, refuse_settings, run_stores
from app.undo import Approver, Code, proven_at_terminal
from store_rollout.guard import WHAT, Action
from store_rollout.settings import SettingsError


def new_box(mac: str, power_type: str | None, bmc_address: str | None, bmc_port: int | None,
            redfish_system_id: str | None, serial: str | None) -> dict[str, Any]:
    """The `replace_box` of the options given (`--bmc-address` is the box's power_address)."""
    given = {"mac": mac, "power_type": power_type, "power_address": bmc_address,
             "power_port": bmc_port, "redfish_system_id": redfish_system_id, "serial": serial}
    return {field: value for field, value in given.items() if value is not None}


def validate_replacement(store_id: str, inventory: Path, box: dict[str, Any]) -> None:
    """The store, the new box's fields and the settings, refused before anything is touched."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.inventory.replacement import with_new_box
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, preflight

    try:
        preflight([with_new_box(load_inventory(inventory), store_id, box)], load_settings())
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError) as exc:
        refuse(str(exc))


# the new box's options, as `replace` and `refresh` (app/refresh.py) take them
NewMac = Annotated[str, typer.Option("--mac", help="the new box's PXE NIC MAC")]
PowerType = Annotated[str | None, typer.Option(
    "--power-type", help="the new box's BMC protocol, ipmi or redfish (default: the old box's)")]
BmcAddress = Annotated[str | None, typer.Option(
    "--bmc-address", help="the new box's BMC address (default: the old box's)")]
BmcPort = Annotated[int | None, typer.Option(
    "--bmc-port", help="the new box's BMC port (default: the old box's)")]
RedfishSystem = Annotated[str | None, typer.Option(
    "--redfish-system-id", help="the new box's Redfish system (default: the old box's)")]
Serial = Annotated[str | None, typer.Option(
    "--serial", help="the new box's serial number (checked in step 3)")]


def replace(
    store_id: str,
    mac: NewMac,
    inventory: RequiredInventory,
    power_type: PowerType = None,
    bmc_address: BmcAddress = None,
    bmc_port: BmcPort = None,
    redfish_system_id: RedfishSystem = None,
    serial: Serial = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    yes: Confirmed = False,
    now: Now = False,
    approver: Approver = "",
    code: Code = "",
) -> None:
    """Move a store to a new box: the old one powered off and its keys deleted, Cobbler's record
    moved to the new MAC, the new box installed, the store VM created on it from the image, the
    ERP told (asks for an approval first, as the approval_policy setting says)."""
    box = new_box(mac, power_type, bmc_address, bmc_port, redfish_system_id, serial)
    validate_replacement(store_id, inventory, box)
    if not yes:
        fields = ", ".join(f"{k} {v}" for k, v in box.items())
        refuse(f"replace of store {store_id} {WHAT[Action.REPLACE_BOX]} ({fields}): add --yes "
               "to go on, with --approver NAME --code CODE (in the store's maintenance window; "
               "--now outside it)")
    approver, code = proven_at_terminal("replace", store_id, approver, code)
    result = run_stores([store_id], inventory, live=not as_json, replace_box=box,
                        approver=approver, code=code, ignore_windows=now)[0]
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        Console(soft_wrap=True).print(f"store {store_id}: {result['state']} in {result['seconds']}s"
                      + (f"\n{result.get('error')}" if result.get("error") else ""))
    if result["state"] != "Completed":
        raise typer.Exit(1)
    # a refreshed store's new box has an id of its own (store_rollout/inventory/fields.py)
    hypervisor = str(result.get("hypervisor") or "")
    written = {**box, **({"minion_id": hypervisor} if "-hv-" in hypervisor else {})}
    fields = ", ".join(f"hypervisor.{k}: {v}" for k, v in written.items())
    console.print(f"store {store_id} runs on the new box: write {fields} into the inventory "
                  "(a rollout with the old box's MAC would move the record back)",
                  soft_wrap=True)
