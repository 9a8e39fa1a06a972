"""`store-rollout refresh STORE --mac NEW`: a live store moved with its data onto its new box
(flows/hardware_refresh.py, run in this process; the store-hardware-refresh deployment runs the
same flow). Shows what it would do and stops unless confirmed with `--yes`. Also the box
commands' registration (`BOX_COMMANDS`: replace and refresh), which app/cli.py adds."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app.offline import Confirmed, Now, RequiredInventory
from app.replace import (
    BmcAddress,
    BmcPort,
    NewMac,
    PowerType,
    RedfishSystem,
    Serial,
    new_box,
    replace,
)
from app.runner import console, refuse, refuse_settings
from app.undo import Approver, Code, proven_at_terminal, terminal_person
from store_rollout.guard import WHAT, Action
from store_rollout.settings import SettingsError


def validate_refresh(store_id: str, inventory: Path, box: dict[str, Any]) -> float:
    """The store, the new box (not another store's, not the store's current one) and the
    settings, refused before anything is touched; the seconds the move needs in the window."""
    from store_rollout.guard import sequence_seconds
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.refresh import refresh_problems, refreshed_store
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, check_region, preflight

    try:
        stores = load_inventory(inventory)
        problems = refresh_problems(stores, store_id, box)
        if problems:
            refuse(problems[0] + "; nothing changed", *problems[1:])
        settings = load_settings()
        check_region(stores.get(store_id), settings)
        preflight([refreshed_store(stores.get(store_id), box)], settings)
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError) as exc:
        refuse(str(exc))
    return sequence_seconds(Action.REFRESH_HARDWARE, settings.disruption_seconds)


def refresh(
    store_id: str,
    mac: NewMac,
    inventory: RequiredInventory,
    power_type: PowerType = None,
    bmc_address: BmcAddress = None,
    bmc_port: BmcPort = None,
    redfish_system_id: RedfishSystem = None,
    serial: Serial = None,
    ip: Annotated[str | None, typer.Option(
        "--ip", help="the new box's own static address (when the store's hypervisor has "
                     "one: the old box keeps it until it is retired)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    yes: Confirmed = False,
    now: Now = False,
    approver: Approver = "",
    code: Code = "",
) -> None:
    """Move a live store with its data onto its new box: the new box installed (its own record
    and minion id), the store VM moved with its disks in the store's window (live on KVM,
    offline on Xen), checked on the new box, then the old box retired (powered off, its VM and
    key gone) and the ERP told. Shows what it would do; `--yes` goes on (with --approver NAME
    --code CODE; `--now` outside the window)."""
    box = new_box(mac, power_type, bmc_address, bmc_port, redfish_system_id, serial)
    box.update({"ip": ip} if ip else {})
    seconds = validate_refresh(store_id, inventory, box)
    if not yes:
        fields = ", ".join(f"{k} {v}" for k, v in box.items())
        refuse(f"refresh of store {store_id} {WHAT[Action.REFRESH_HARDWARE]} ({fields}); it "
               f"needs {seconds / 60:.0f} min of the store's maintenance window for the move "
               "(the new box is installed ahead): add --yes to go on, with --approver NAME "
               "--code CODE (--now outside the window)")
    approver, code = proven_at_terminal("refresh", store_id, approver, code)
    result = run_refresh(store_id, inventory, box, now=now, approver=approver, code=code)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    fields = ", ".join(f"{k}: {v}" for k, v in result.get("inventory", {}).items())
    console.print(f"store {store_id}: {result.get('outcome')}; it runs on "
                  f"{result.get('new_minion')}: write {fields} into the inventory", soft_wrap=True)


def run_refresh(store_id: str, inventory: Path, box: dict[str, Any], *, now: bool,
                approver: str, code: str) -> dict[str, Any]:
    """The refresh flow in this process; exits 1 naming its state when it fails."""
    from flows.hardware_refresh import store_hardware_refresh

    with contextlib.redirect_stdout(sys.stderr):  # Salt prints to stdout: kept for the result
        state = store_hardware_refresh(
            store_id, str(inventory.resolve()), box, return_state=True, approver=approver,
            code=code, asked_by=f"{terminal_person()}: store-rollout refresh {store_id}",
            ignore_windows=now)
    if not state.is_completed():
        console.print(f"[red]refresh of {store_id} {state.name}:[/] {state.message}",
                      soft_wrap=True)
        raise typer.Exit(1)
    return dict(state.result())


# the commands about a store's box, as app/cli.py registers them
BOX_COMMANDS = (("replace", replace), ("refresh", refresh))
