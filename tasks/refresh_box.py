"""A hardware refresh's own steps (`store-rollout refresh`, issue 48), beside those it reuses
(steps 2-3 for the new box, the image update's stage, wait and gate, the host helper's trust and
move): what the systems say before anything moves (`read_refresh_state`: the two boxes' keys,
the old box's Cobbler record, who holds the new MAC, the ERP, where the store VM's domain is),
the old box's retirement after the new box's gate passed (`forget_moved_vm`,
`delete_old_hypervisor_key`; its Cobbler record and power are the decommission's tasks) and the
ERP's one `store-hardware-refreshed` notice (`notify_erp_refreshed`).

What to do and in which order is flows/hardware_refresh.py's, what it decides
store_rollout/refresh.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task

from store_rollout import step_rules
from store_rollout.contracts import ERP_STORE_HARDWARE_REFRESHED
from store_rollout.inventory import Store
from store_rollout.refresh import RefreshRefused
from store_rollout.settings_parts import CobblerSettings, ErpSettings, SaltSettings
from tasks.cobbler import CobblerUnavailable, cobbler_client
from tasks.erp import BoxNotice, ErpUnavailable, erp_client
from tasks.retry import ERP_RETRY, SALT_KEYS_RETRY, SALT_VIRT_RETRY, SALT_WAIT_RETRY
from tasks.salt import SaltMasterClient, SaltTransientError, master_client


class NotOnNewBox(RuntimeError):
    """The old box is not retired: the store VM's domain does not run on the new box."""


def other_holders(client: Any, mac: str, old: Store, new: Store) -> list[str]:
    """The Cobbler systems other than the store's two boxes' that hold `mac`."""
    return [name for name in client.find_systems(mac_address=mac)
            if name not in (old.cobbler_system, new.cobbler_system)]


def domain_where(master: SaltMasterClient, old: Store, new: Store,
                 keys: dict[str, str | None]) -> dict[str, Any] | None:
    """The store VM's domain summary with "on": "new" or "old" (the new box's when it runs
    there, else the old box's, else a new box's stopped one), or None when neither box with an
    accepted key holds it. A box that does not answer fails the read: silence is not absence."""
    found: dict[str, dict[str, Any]] = {}
    for side, store in (("new", new), ("old", old)):
        if keys[side] == "accepted":
            summary = master.cmd(store.hypervisor_minion_id, "storevirt.domain_summary",
                                 [store.vm_name])
            if summary:
                found[side] = {**summary, "on": side}
    if found.get("new", {}).get("active") or "old" not in found:
        return found.get("new")
    return found["old"]


@task(name="refresh_state", task_run_name="refresh-state-{old.store_id}",
      **SALT_WAIT_RETRY.on(SaltTransientError, CobblerUnavailable))
def read_refresh_state(old: Store, new: Store, salt: SaltSettings, cobbler: CobblerSettings,
                       erp: ErpSettings) -> dict[str, Any]:
    """Before anything moves: RefreshRefused (nothing touched) when a Cobbler system other
    than the store's holds the new box's MAC; else {"old_key", "new_key", "old_record",
    "live", "domain"} (store_rollout/refresh.decide_refresh reads it)."""
    client = cobbler_client(cobbler)
    held = other_holders(client, new.hypervisor.mac, old, new)
    if held:
        raise RefreshRefused(f"refresh --mac {new.hypervisor.mac}: Cobbler system {held[0]} "
                             "holds that MAC (another store's box, or a stale record): give "
                             f"store {old.store_id}'s new box's own MAC, or remove that record "
                             "if it is stale; nothing changed")
    master = master_client(salt.salt_master_config)
    keys = {"old": master.key_state(old.hypervisor_minion_id),
            "new": master.key_state(new.hypervisor_minion_id)}
    found: dict[str, Any] = {"old_key": keys["old"], "new_key": keys["new"],
             "old_record": client.get_system(old.cobbler_system) is not None,
             "live": step_rules.store_live(erp_client(erp).notices(old.store_id)),
             "domain": domain_where(master, old, new, keys)}
    get_run_logger().info("store %s: old box %s key %s, new box %s key %s; domain on %s",
                          old.store_id, old.hypervisor_minion_id, keys["old"] or "none",
                          new.hypervisor_minion_id, keys["new"] or "none",
                          (found["domain"] or {}).get("on", "neither box"))
    return found


@task(name="forget_moved_vm", task_run_name="forget-moved-{old.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def forget_moved_vm(old: Store, new: Store, salt: SaltSettings) -> dict[str, Any]:
    """After the new box's gate passed: the store VM's domain, disks and move record removed
    from the OLD box (`storevirt.forget_moved`), only while the new box runs the domain
    (NotOnNewBox otherwise, nothing removed); nothing when the old box's key is gone (retired
    by an earlier run). The old box must answer: its disks are never taken for gone."""
    master = master_client(salt.salt_master_config)
    if master.key_state(old.hypervisor_minion_id) != "accepted":
        return {"forgot": None, "already": True}
    there = master.cmd(new.hypervisor_minion_id, "storevirt.domain_summary", [new.vm_name])
    if not there or not there.get("active"):
        raise NotOnNewBox(f"store {old.store_id}: {new.vm_name} does not run on the new box "
                          f"{new.hypervisor_minion_id} ({'shut off' if there else 'no domain'})"
                          f": the old box {old.hypervisor_minion_id} keeps the VM and its disks")
    forgot = master.cmd(old.hypervisor_minion_id, "storevirt.forget_moved", [old.vm_name])
    get_run_logger().warning("store %s: %s and its disks removed from the old box %s: %s",
                             old.store_id, old.vm_name, old.hypervisor_minion_id, forgot)
    return {"forgot": forgot, "already": False}


@task(name="delete_old_hypervisor_key", task_run_name="delete-old-hv-key-{old.store_id}",
      **SALT_KEYS_RETRY.on(SaltTransientError))
def delete_old_hypervisor_key(old: Store, new: Store, salt: SaltSettings) -> dict[str, Any]:
    """The OLD box's hypervisor minion forgotten by the master (its autosign token revoked,
    its key deleted); never the VM's key (it moved with its data disk), never the new box's."""
    minion = old.hypervisor_minion_id
    if minion in (new.hypervisor_minion_id, old.vm_minion_id):
        raise ValueError(f"store {old.store_id}: refusing to delete {minion}: not the old box's "
                         "own hypervisor minion")
    master = master_client(salt.salt_master_config)
    revoked = master.revoke_token(minion)
    deleted = master.delete_keys([minion])
    get_run_logger().info("store %s: old box %s's key deleted: %s", old.store_id, minion,
                          deleted or "none (gone already)")
    return {"keys_deleted": deleted, "token_revoked": revoked}


@dataclass(frozen=True)
class RefreshNotice(BoxNotice):
    """The store runs on the box `hardware` describes, moved with its data from `old_mac`'s
    (`ERP_STORE_HARDWARE_REFRESHED`): the same store server (VM, minion, key), no new store.
    One per store and new box (its MAC): a rerun replays it."""

    move: dict[str, Any] | None = None

    def payload(self) -> dict[str, Any]:
        return {"store_id": self.store_id, "site_code": self.site_code,
                "hypervisor": self.hypervisor, "status": self.status,
                "hardware": self.hardware, "old_hardware": {"mac": self.old_mac},
                "move": self.move or {}}


@task(name="notify_erp_refreshed", task_run_name="notify-erp-refreshed-{new.store_id}",
      **ERP_RETRY.on(ErpUnavailable))
def notify_erp_refreshed(new: Store, old_mac: str, move: dict[str, Any],
                         erp: ErpSettings) -> dict[str, Any]:
    """After the old box's retirement: tell the ERP the store runs on its new box with its data
    (once per store and new MAC: a rerun replays the same notice)."""
    hv = new.hypervisor
    hardware = {"mac": hv.mac, "serial": hv.serial, "power_type": hv.power_type,
                "power_address": hv.power_address}
    result = erp_client(erp).notify(RefreshNotice(
        store_id=new.store_id, site_code=new.erp.site_code, hypervisor=new.hypervisor_minion_id,
        hypervisor_mac=hv.mac, status=ERP_STORE_HARDWARE_REFRESHED, hardware=hardware,
        old_mac=old_mac, move={k: move.get(k) for k in ("mode", "downtime_seconds", "bytes")}))
    get_run_logger().info("store %s: ERP told it runs on the new box %s, id %s%s",
                          new.store_id, hv.mac, result["erp_id"],
                          " (replayed)" if result["replay"] else "")
    return result
