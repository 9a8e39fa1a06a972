"""A hardware refresh (`store-rollout refresh`, issue 48): the live store moved, with its disks,
from its box onto a new one that signs in beside it under an id of its own. What the store will
be on the new box (`refreshed_store`), why a refresh is refused before anything moves
(`refresh_problems`), what a run does from what the systems say (`decide_refresh`) and what the
operator writes into the inventory after it (`inventory_update`).

Pure functions: flows/hardware_refresh.py reads, calls these, and acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from store_rollout.inventory.bmc import bmc_identity
from store_rollout.inventory.fields import mac_suffix, refreshed_minion_id
from store_rollout.inventory.models import HypervisorSpec, Inventory, InventoryError, Store
from store_rollout.inventory.replacement import BOX_FIELDS, refuse_box_fields

# what a refresh gives of its new box: a replacement's fields, and the new box's own static
# address when the store's hypervisor has one (the old box keeps it until it is retired)
REFRESH_BOX_FIELDS: Final = (*BOX_FIELDS, "ip")
# the steps of a refresh (each a task run `<step>-<store>`, timed by StepClock); the store is
# down during `move` (an offline move; a live one only for its switch-over: downtime_seconds)
STEP_REFRESH_STATE: Final = "refresh_state"
STEP_STAGE_BASE: Final = "stage_base"
STEP_TLS: Final = "libvirt_tls"
STEP_MOVE: Final = "move"
STEP_VM_BACK: Final = "vm_back"
STEP_GO_LIVE: Final = "go_live"
STEP_RETIRE: Final = "retire_old_box"
# what each check is called where a run names the one that failed
CHECKS: Final = {
    STEP_MOVE: "the move of the store VM and its disks",
    STEP_VM_BACK: "the VM's minion answering from the new box with its own key",
    STEP_GO_LIVE: "the go-live gate on the new box",
    STEP_RETIRE: "the old box's retirement",
}


class RefreshRefused(RuntimeError):
    """A refresh that cannot start: nothing was touched (the message names the field and
    the fix)."""


def refreshed_hostname(store: Store, mac: str) -> str:
    """The new box's host name while both boxes run (Cobbler and DNS keep one name per box):
    the store's, its first label ending in the new MAC's suffix (a previous refresh's suffix
    replaced, not stacked)."""
    first, _, rest = store.hypervisor.hostname.partition(".")
    given = store.hypervisor.minion_id or ""
    old = given.rsplit("-", 1)[-1] if given != f"store-{store.store_id}-hv" and given else ""
    if old and first.endswith(f"-{old}"):
        first = first[: -len(old) - 1]
    label = f"{first[:63 - 7].rstrip('-')}-{mac_suffix(mac)}"
    return f"{label}.{rest}" if rest else label


def refreshed_store(store: Store, box: dict[str, Any]) -> Store:
    """The store as it will be on the new box `box` (app/replace.py `new_box()`: mac, power_*,
    redfish_system_id, serial; `ip` when the store's hypervisor has a static one): the box's
    fields over the old box's, its serial the new box's or none, its hypervisor minion id
    store-<id>-hv-<last 6 hex digits of the MAC> (its own Cobbler record and key, beside the
    old box's) and its host name refreshed_hostname's. InventoryError naming the field."""
    refuse_box_fields(box, REFRESH_BOX_FIELDS, "refresh box", store.store_id, mac="--mac")
    old = store.hypervisor.model_dump(exclude_none=True, exclude={"serial", "minion_id"})
    fields = {**old, **box}
    try:
        mac = HypervisorSpec.model_validate({**fields, "minion_id": None}).mac
        hypervisor = HypervisorSpec.model_validate(
            {**fields, "minion_id": refreshed_minion_id(store.store_id, mac),
             "hostname": refreshed_hostname(store, mac)})
    except ValidationError as exc:
        problems = "; ".join(
            f"hypervisor.{'.'.join(str(p) for p in err['loc']) or 'box'}: "
            f"{err['msg'].removeprefix('Value error, ')}" for err in exc.errors())
        raise InventoryError(f"refresh of store {store.store_id}: {problems}") from None
    return store.model_copy(update={"hypervisor": hypervisor})


def _bmc(hv: HypervisorSpec) -> tuple[str, str, str] | None:
    return bmc_identity(hv.power_address, hv.power_type, hv.power_port, hv.redfish_system_id)


def refresh_problems(inventory: Inventory, store_id: str, box: dict[str, Any]) -> list[str]:
    """Why the store cannot be refreshed onto `box`, each one line naming the field and the fix
    (empty: it can): the store unknown, the box's fields invalid, the box the store's current
    one, or another store's (its MAC, serial, BMC address+port+system, static address), the
    new box's BMC the old box's (step 2 would power-cycle the live store), a static hypervisor
    address without the new box's own."""
    try:
        store = inventory.get(store_id)
        new = refreshed_store(store, box)
    except InventoryError as exc:
        return [str(exc)]
    old_hv, hv, problems = store.hypervisor, new.hypervisor, []
    if hv.mac == old_hv.mac:
        problems.append(f"refresh --mac {hv.mac}: the MAC of store {store_id}'s current box: give "
                        "the new box's PXE NIC MAC (a box already refreshed onto needs nothing)")
    if hv.serial and hv.serial == old_hv.serial:
        problems.append(f"refresh --serial {hv.serial}: the serial of store {store_id}'s current "
                        "box: give the new box's, as on its label")
    if _bmc(hv) is not None and _bmc(hv) == _bmc(old_hv):
        problems.append(f"refresh --bmc-address {hv.power_address}: the BMC of store {store_id}'s "
                        "current box (same address, port and system): give the new box's own "
                        "--bmc-address (and --bmc-port, --redfish-system-id)")
    if old_hv.ip != "dhcp" and hv.ip in (old_hv.ip, "dhcp") and "ip" not in box:
        problems.append(f"refresh --ip: store {store_id}'s hypervisor has the static address "
                        f"{old_hv.ip}, which its current box keeps until it is retired: give "
                        "the new box's own static address (--ip)")
    elif "ip" in box and hv.ip != "dhcp" and hv.ip == old_hv.ip:
        problems.append(f"refresh --ip {hv.ip}: the current box's address: give the new box "
                        "its own")
    for other in (s for s in inventory.stores if s.store_id != store_id):
        theirs = other.hypervisor
        for option, shown, mine, its in (
                ("--mac", hv.mac, hv.mac, theirs.mac),
                ("--serial", hv.serial, hv.serial, theirs.serial),
                ("--bmc-address", hv.power_address, _bmc(hv), _bmc(theirs)),
                ("--ip", hv.ip, None if hv.ip == "dhcp" else hv.ip, theirs.ip)):
            if mine is not None and mine == its:
                problems.append(f"refresh {option} {shown}: store {other.store_id}'s box in the "
                                f"inventory, not a new box of store {store_id}: give the new "
                                "box's own")
    return problems


@dataclass(frozen=True)
class RefreshDecision:
    """What a refresh run does: `refresh` (install or find the new box, move, retire: each
    step finds what an earlier run did) or `already` (the old box is retired and the store
    runs on the new one: only the ERP notice is replayed)."""

    action: Literal["refresh", "already"]
    reason: str


def decide_refresh(old: Store, new: Store, found: dict[str, Any]) -> RefreshDecision:
    """From what the systems say (`found`: "old_key", "new_key" (the master's key states of
    the two hypervisor minions), "old_record" (the old box's Cobbler record exists), "live"
    (the ERP knows the store live), "domain" (the VM's domain summary, from whichever box
    holds it, or None)): what a refresh of `old` onto `new` does now; RefreshRefused (nothing
    touched) for a store that is no live store on its box."""
    sid = old.store_id
    if found.get("old_key") is None and not found.get("old_record"):
        if found.get("new_key") == "accepted":
            return RefreshDecision("already", f"store {sid}: the old box "
                                   f"{old.hypervisor_minion_id} is retired already and "
                                   f"{new.hypervisor_minion_id} holds the store")
        raise RefreshRefused(f"store {sid}: its box {old.hypervisor_minion_id} has neither a "
                             "key nor a Cobbler record (never rolled out, or gone): nothing "
                             "to move; roll it out (`store-rollout rollout`) or, for a dead "
                             "box, `store-rollout replace`")
    if not found.get("live"):
        raise RefreshRefused(f"store {sid}: the ERP knows no running store server of it (never "
                             "live, or decommissioned): nothing to move; roll it out instead")
    domain = found.get("domain")
    if domain is None:
        raise RefreshRefused(f"store {sid}: its store server's domain {old.vm_name} is on "
                             f"neither {old.hypervisor_minion_id} nor "
                             f"{new.hypervisor_minion_id}: nothing to move; see `store-rollout "
                             "reconcile`")
    if not domain.get("data_disk"):
        raise RefreshRefused(f"store {sid}: its VM {old.vm_name} has no data disk (defined before "
                             "data disks existed): its data and identity live on its system "
                             "disk, which a refresh does not carry; give it a data disk first "
                             "(docs/operations.md, Image updates)")
    where = "the new box" if domain.get("on") == "new" else "the old box"
    return RefreshDecision("refresh", f"store {sid}: its store server runs on {where}; the "
                           f"new box {new.hypervisor_minion_id} is "
                           f"{'known to' if found.get('new_key') else 'new to'} the master")


def inventory_update(new: Store) -> dict[str, Any]:
    """What the operator writes into the inventory once the store runs on the new box (a
    rollout with the old box's fields would look for the retired one)."""
    hv = new.hypervisor
    fields = {"hypervisor.mac": hv.mac, "hypervisor.minion_id": hv.minion_id,
              "hypervisor.hostname": hv.hostname, "hypervisor.ip": hv.ip,
              "hypervisor.power_type": hv.power_type,
              "hypervisor.power_address": hv.power_address,
              "hypervisor.power_port": hv.power_port,
              "hypervisor.redfish_system_id": hv.redfish_system_id,
              "hypervisor.serial": hv.serial}
    return {field: value for field, value in fields.items() if value is not None}


def report(store_id: str, result: dict[str, Any]) -> str:
    """The run's markdown artifact: outcome, mode, downtime, bytes, each step or check, and
    what to write into the inventory."""
    rows = "\n".join(f"| {step} | {CHECKS.get(step, '')} | {value} |"
                     for step, value in result.get("step_seconds", {}).items())
    write = "\n".join(f"- `{k}: {v}`" for k, v in result.get("inventory", {}).items())
    moved = result.get("move") or {}
    return (f"# Store {store_id} hardware refresh\n\n"
            f"- outcome: **{result.get('outcome')}**\n"
            f"- from box: `{result.get('old_minion')}` to box: `{result.get('new_minion')}`\n"
            f"- mode: {moved.get('mode', '-')}\n"
            f"- downtime: {moved.get('downtime_seconds', '-')} s\n"
            f"- bytes moved: {moved.get('bytes', '-')}\n"
            + (f"- failed: {result['failed_check']}\n" if result.get("failed_check") else "")
            + f"\n| step | check | seconds |\n|---|---|---|\n{rows}\n\n"
            f"## Write into the inventory\n\n{write or '- nothing'}\n")
