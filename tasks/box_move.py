"""A store VM's move to the store's new box (issue 48's refresh), through both boxes' minions
(the project's `storevirt` on each host): live on KVM (libvirt's peer-to-peer migration over TLS
with the disks' content, `storevirt.migrate_live`), offline on Xen, whose libxl has no storage
migration (shut down, `storevirt.send_disks` over the new box's libvirtd on TLS, checksums
compared, defined and started on the new box, undefined on the old one).

Refused before anything moves (MoveRefused) unless the target is the store's new box: the same
store, another minion than the old box, and a box whose libvirt certificate is this master's
CA's for that minion at that address (`storevirt.tls_status`). The old box writes its move
record before anything moves, so a rerun reads where the VM is from both boxes first and goes
on (the VM running on the new box and gone from the old one: done).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Final, Literal

from prefect import get_run_logger, task

from store_rollout.inventory import Store
from store_rollout.platforms import store_platform
from store_rollout.settings_parts import SaltSettings
from store_rollout.settings_refresh import RefreshPart
from tasks.libvirt_tls import ca_dir_of, trusted
from tasks.retry import BOX_MOVE_RETRY
from tasks.salt import SaltMasterClient, SaltTransientError, master_client
from tasks.store_vm import start_domain

SHUTDOWN_TIMEOUT: Final = 120.0  # seconds the VM's OS gets to power off (offline path)
START_TIMEOUT: Final = 120.0  # seconds the new box gets to have the VM running
CALL_MARGIN: Final = 60.0  # seconds a host's answer may come after its own bound


class MoveRefused(RuntimeError):
    """The target is not the store's new box (nothing moved)."""


class MoveFailed(RuntimeError):
    """The move did not complete (the copy's checksums differ, the VM on both boxes)."""


def move_refusal(old: Store, new: Store) -> str | None:
    """Why `new` cannot receive `old`'s VM, before any call (None: it may)."""
    if new.store_id != old.store_id:
        return (f"store {old.store_id}: the target box is store {new.store_id}'s "
                f"({new.hypervisor_minion_id}), not this store's new box; nothing moved")
    if new.hypervisor_minion_id == old.hypervisor_minion_id:
        return (f"store {old.store_id}: the target {new.hypervisor_minion_id} is the box the "
                "VM runs on; a refresh moves it to the new box (its own minion id); nothing "
                "moved")
    return None


def move_mode(store: Store) -> Literal["live", "offline"]:
    """KVM migrates live with the disks' content; Xen moves offline (libxl has no storage
    migration). The store's platform decides (PlatformError when it has none)."""
    return "live" if store_platform(store.hypervisor.platform, "").vm_type == "kvm" else "offline"


def trusted_target(old: Store, new: Store, new_address: str, salt: SaltSettings,
                   refresh: RefreshPart) -> SaltMasterClient:
    """The master's client once `new` is the store's new box with this CA's certificate for
    `new_address` (MoveRefused before anything moves, the store and the box checked before any
    call)."""
    problem = move_refusal(old, new)
    if problem:
        raise MoveRefused(problem)
    ca_dir = ca_dir_of(refresh)
    master = master_client(salt.salt_master_config)
    minion = new.hypervisor_minion_id
    status = master.cmd(minion, "storevirt.tls_status")
    if not trusted(status, minion, new_address, ca_dir, renew_before=timedelta(0)):
        raise MoveRefused(f"store {old.store_id}: {minion} at {new_address} has no valid libvirt "
                          f"certificate of this master's CA for that name and address "
                          f"({status}); run ensure_libvirt_tls for it first; nothing moved")
    return master


def _done(phase: str, mode: str, **measured: Any) -> dict[str, Any]:
    return {"mode": mode, "seconds": measured.get("seconds", 0.0),
            "downtime_seconds": measured.get("downtime_seconds"),
            "bytes": measured.get("bytes", 0), "sha256": measured.get("sha256", {}),
            "phase": phase}


def _live(master: SaltMasterClient, old: Store, new: Store, address: str,
          disks: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    name = old.vm_name
    master.cmd(new.hypervisor_minion_id, "storevirt.prepare_incoming", [name, disks])
    moved = master.cmd(old.hypervisor_minion_id, "storevirt.migrate_live",
                       [name, address, new.hypervisor_minion_id, timeout],
                       timeout=timeout + CALL_MARGIN)
    downtime = moved.get("downtime_ms")
    return _done("moved", "live", seconds=moved["seconds"], bytes=moved["bytes"],
                 downtime_seconds=None if downtime is None else downtime / 1000)


def _offline_copy(master: SaltMasterClient, old: Store, new: Store, address: str,
                  timeout: float) -> dict[str, Any]:
    """The shut-off VM's disks onto the new box, checksummed, and defined there."""
    hv_old, hv_new, name = old.hypervisor_minion_id, new.hypervisor_minion_id, old.vm_name
    sent = master.cmd(hv_old, "storevirt.send_disks", [name, address, hv_new],
                      timeout=timeout + CALL_MARGIN)
    wanted = {d["path"]: d["sha256"] for d in sent["disks"]}
    if not sent["complete"]:
        raise MoveFailed(f"store {old.store_id}: send_disks stopped before the end "
                         f"({sent['disks']}); a rerun goes on from the record")
    there = master.cmd(hv_new, "storevirt.disks_sha256", [name, sorted(wanted)], timeout=timeout)
    if there != wanted:  # once more from the start: a resumed copy's offsets are not trusted
        sent = master.cmd(hv_old, "storevirt.send_disks", [name, address, hv_new, None, True],
                          timeout=timeout + CALL_MARGIN)
        wanted = {d["path"]: d["sha256"] for d in sent["disks"]}
        there = master.cmd(hv_new, "storevirt.disks_sha256", [name, sorted(wanted)],
                           timeout=timeout)
    if there != wanted:
        raise MoveFailed(f"store {old.store_id}: the disks on {hv_new} differ from the old "
                         f"box's (sha256 {there} != {wanted}); the VM stays defined on "
                         f"{hv_old}, its disks there untouched")
    xml = master.cmd(hv_old, "storevirt.domain_xml", [name])
    master.cmd(hv_new, "storevirt.define_incoming", [name, xml])
    return {"sha256": wanted, "bytes": sum(d["bytes_sent"] for d in sent["disks"])}


def back_on_old_box(master: SaltMasterClient, old: Store, new: Store, cause: Exception) -> None:
    """An offline move failed after the VM was shut down, before it ran on the new box: the
    new box's copy undefined (it must never start a second one) and the VM started again on
    the old box, whose disks were only read; then MoveFailed. A new box that does not answer,
    or runs the VM, is left as it is (silence is not absence: no second copy is started)."""
    name, hv_new = old.vm_name, new.hypervisor_minion_id
    there = master.cmd(hv_new, "storevirt.move_state", [name])
    if there["running"]:
        raise cause
    if there["defined"]:
        master.cmd(hv_new, "virt.undefine", [name])
    start_domain(master, old, START_TIMEOUT, logger=get_run_logger())
    raise MoveFailed(f"store {old.store_id}: the offline move to {hv_new} failed ({cause}); "
                     f"the VM runs again on the old box {old.hypervisor_minion_id}, nothing "
                     "removed there; rerun the refresh to try again") from cause


def _offline(master: SaltMasterClient, old: Store, new: Store, address: str,
             states: tuple[dict[str, Any], dict[str, Any]], timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    before, after = states
    copied: dict[str, Any] = {}
    if before["running"]:
        master.cmd(old.hypervisor_minion_id, "storevirt.shutdown",
                   [old.vm_name, SHUTDOWN_TIMEOUT], timeout=SHUTDOWN_TIMEOUT + CALL_MARGIN)
    try:
        if not after["defined"]:
            copied = _offline_copy(master, old, new, address, timeout)
        start_domain(master, new, START_TIMEOUT, logger=get_run_logger())
    except Exception as exc:  # noqa: BLE001 - whatever failed, the store must not stay down
        back_on_old_box(master, old, new, exc)
    master.cmd(old.hypervisor_minion_id, "storevirt.release_moved", [old.vm_name])
    seconds = round(time.monotonic() - started, 1)
    return _done("moved", "offline", seconds=seconds, downtime_seconds=seconds, **copied)


@task(name="move_store_vm", task_run_name="move-store-vm-{old.store_id}",
      **BOX_MOVE_RETRY.on(SaltTransientError))
def move_store_vm(old: Store, new: Store, salt: SaltSettings, refresh: RefreshPart,
                  new_address: str) -> dict[str, Any]:
    """Move `old`'s store VM with its disks to the store's new box `new` (at `new_address`):
    live on KVM, offline on Xen (the store's platform). MoveRefused, nothing moved, unless
    `new` is the store's new box with this CA's certificate for its address. Resumable."""
    master = trusted_target(old, new, new_address, salt, refresh)
    name, mode = old.vm_name, move_mode(old)
    before = master.cmd(old.hypervisor_minion_id, "storevirt.move_state", [name])
    after = master.cmd(new.hypervisor_minion_id, "storevirt.move_state", [name])
    logger = get_run_logger()
    if after["running"] and not before["defined"]:
        logger.info("store %s: %s runs on %s already", old.store_id, name,
                    new.hypervisor_minion_id)
        return _done("moved", mode)
    if after["defined"] and before["running"]:
        raise MoveFailed(f"store {old.store_id}: {name} is defined on {new.hypervisor_minion_id} "
                         f"and runs on {old.hypervisor_minion_id}; nothing moved (the old box "
                         "holds the store's data: remove the new box's domain, then rerun)")
    timeout = refresh.refresh_move_timeout_seconds
    if mode == "live" and not after["defined"]:
        result = _live(master, old, new, new_address, before["disks"], timeout)
    else:
        result = _offline(master, old, new, new_address, (before, after), timeout)
    logger.info("store %s: %s moved %s to %s in %s s (downtime %s s, %s bytes)",
                old.store_id, name, result["mode"], new.hypervisor_minion_id, result["seconds"],
                result["downtime_seconds"], result["bytes"])
    return result
