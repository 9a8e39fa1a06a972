"""Move one live store onto its new box with its data (issue 48, `store-rollout refresh`):
refused before anything is touched when the new box is another store's or the store is no live
store with a data disk; asked for by name and approved (store_rollout/guard.py); the new box
installed as steps 2-3 do (its own Cobbler record and minion id, its serial checked) and the
store VM's base image and libvirt TLS trust put on it ahead; in the store's window the VM moved
with its disks (live on KVM, offline on Xen), its minion back under its own id and key, the
go-live gate on the new box; only then the old box retired (the VM's leftovers removed, its own
key deleted, its Cobbler record removed, powered off) and the ERP told once. A failed move or
check ends the run Failed naming it, the old box NOT retired. A rerun finds where the VM is.

Wiring only; what it decides is store_rollout/refresh.py's, what it changes tasks/'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefect import State, flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from store_rollout import guard
from store_rollout.approval_policy import tightened
from store_rollout.contracts import STEP_IMAGE, STEP_PXE_INSTALL_HYPERVISOR, STEP_WAIT_FOR_HYPERVISOR
from store_rollout.guard import Action, Consent
from store_rollout.image_versions import build_of, store_version
from store_rollout.inventory import Store, load_inventory
from store_rollout.inventory.models import InventoryError
from store_rollout.refresh import (
    CHECKS,
    STEP_GO_LIVE,
    STEP_MOVE,
    STEP_REFRESH_STATE,
    STEP_RETIRE,
    STEP_STAGE_BASE,
    STEP_TLS,
    STEP_VM_BACK,
    RefreshDecision,
    RefreshRefused,
    decide_refresh,
    inventory_update,
    refresh_problems,
    refreshed_store,
    report,
)
from store_rollout.settings import load_settings
from store_rollout.settings_parts import SettingsParts
from store_rollout.settings_refresh import RefreshPart
from store_rollout.step_timeouts import STEP_TIMEOUTS
from store_rollout.steps import StepClock
from store_rollout.updates import VM_BACK_TIMEOUT
from tasks.approvals import undo_consent
from tasks.audit import record
from tasks.bmc import power_off_hypervisor
from tasks.box_move import move_store_vm
from tasks.cobbler import remove_hypervisor_record
from tasks.go_live import go_live_gate
from tasks.image_update import update_window, wait_vm_back
from tasks.kiwi import ensure_image
from tasks.libvirt_tls import ca_dir_of, ensure_libvirt_tls, forget_address
from tasks.notifications import notify_failure
from tasks.preflight import check_region, preflight
from tasks.pxe_install import pxe_install_hypervisor
from tasks.refresh_box import (
    delete_old_hypervisor_key,
    forget_moved_vm,
    notify_erp_refreshed,
    read_refresh_state,
)
from tasks.run_health import beating, this_flow_run
from tasks.salt_master import wait_for_hypervisor
from tasks.slots import store_owner
from tasks.virt import stage_image
from tasks.windows import NoMaintenanceWindow, run_in_window


@dataclass(frozen=True)
class RefreshRun:
    """What the steps of one store's refresh share: the store on its old box and as it will be
    on the new one, the settings' parts, the clock, how the run asks for its consent."""

    old: Store
    new: Store
    parts: SettingsParts
    refresh: RefreshPart
    clock: StepClock
    consent: Callable[[], Consent]
    params: dict[str, Any]


def prepared(settings: Any, params: dict[str, Any]) -> RefreshRun:
    """The store, the new box and the settings checked, refused (InventoryError, one line per
    problem) before anything is touched; `params`: the flow's parameters."""
    stores = load_inventory(params["inventory"])
    problems = refresh_problems(stores, params["store_id"], params["new_box"])
    if problems:
        raise InventoryError("; ".join(problems) + "; nothing changed")
    old = stores.get(params["store_id"])
    new = refreshed_store(old, params["new_box"])
    check_region(old, settings)
    preflight([new], settings)
    if not RefreshPart.of(settings).libvirt_ca_dir:
        raise RefreshRefused("libvirt_ca_dir: empty; the boxes trust each other through the "
                             "master's libvirt CA: set STORE_ROLLOUT_LIBVIRT_CA_DIR to a "
                             "directory on the master (made on first use); nothing changed")
    consent = partial(undo_consent, old, Action.REFRESH_HARDWARE,
                      tightened(settings.approval_policy, params["approval_policy"]),
                      params["approval_timeout"] or settings.approval_timeout_seconds,
                      SettingsParts.of(settings).approvals,
                      asked_by=params["asked_by"] or f"run refresh-{old.store_id}",
                      approver=params["approver"], code=params["code"],
                      ignore_windows=params["ignore_windows"])
    return RefreshRun(old, new, SettingsParts.of(settings), RefreshPart.of(settings),
                      StepClock(old.store_id), consent, params)


@flow(name="store-hardware-refresh", flow_run_name="refresh-{store_id}",
      on_failure=[notify_failure])
@beating
def store_hardware_refresh(store_id: str, inventory: str, new_box: dict[str, Any],
                           ignore_windows: bool = False, approval_policy: str | None = None,
                           approval_timeout: float | None = None, approver: str = "",
                           code: str = "", asked_by: str = "",
                           owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                           hypervisor_timeout: float = STEP_TIMEOUTS.hypervisor_timeout,
                           hypervisor_stall_timeout: float = (
                               STEP_TIMEOUTS.hypervisor_stall_timeout),
                           vm_back_timeout: float = VM_BACK_TIMEOUT) -> dict[str, Any] | State:
    """Move one live store with its data onto its new box, in its window (see the module).

    Args:
        store_id: The store, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host.
        new_box: The new box: its `mac` and, where they differ from the old box's,
            `power_type`, `power_address`, `power_port`, `redfish_system_id`,
            `bmc_credentials_block`, `ipmi_cipher_suite`; its `serial` (checked in step 3);
            `ip` when the store's hypervisor has a static address (the new box's own).
        ignore_windows: Move outside the store's maintenance window (only with a proven
            approver).
        approval_policy: Stricter than the setting only.
        approval_timeout: Seconds the run waits paused for the answer before it is parked.
        approver: The approver who confirmed it at a terminal (`--yes`), proven by `code`.
        code: The approver's one-time code, checked by this run and used up.
        asked_by: Who asked for it (recorded with the guard's decision).
        owner_wait_seconds: Seconds to wait while another run owns the store.
        hypervisor_timeout: Seconds step 3 waits for the new box's ready event.
        hypervisor_stall_timeout: Seconds the new box may answer without getting ready before
            its highstate is applied again.
        vm_back_timeout: Seconds to wait after the move for the VM's minion to answer from the
            new box with its accepted key.
    """
    run = prepared(load_settings(), dict(locals()))
    with store_owner(store_id, owner_wait_seconds, this_flow_run()), \
            tags(f"store-{store_id}", "store-hardware-refresh"):
        found = run.clock.run(STEP_REFRESH_STATE, read_refresh_state, run.old, run.new,
                              run.parts.salt, run.parts.cobbler, run.parts.erp)
        decision = decide_refresh(run.old, run.new, found)
        get_run_logger().warning("%s", decision.reason)
        done = ({"outcome": "already"} if decision.action == "already"
                else refresh(run, found["domain"]))
    return ended(run, decision, done)


def refresh(run: RefreshRun, domain: dict[str, Any]) -> dict[str, Any]:
    """The guard asked first (a refusal installs nothing), the new box made ready ahead of
    the window, then in the window the move and its checks, and the old box retired."""
    consent = run.consent()
    first = update_window(Action.REFRESH_HARDWARE, run.old, consent, run.parts.calendar)
    if not first["window"]["go"] and first["window"].get("wait_until") is None:
        raise NoMaintenanceWindow(f"store {run.old.store_id}: {first['window']['reason']}; "
                                  "nothing changed (the new box is not installed either)")
    tls = new_box_ready(run, consent, domain)
    allowed = run_in_window(run.old.store_id, lambda: update_window(
        Action.REFRESH_HARDWARE, run.old, consent, run.parts.calendar))
    move, failed = moved(run, tls["new"]["address"])
    if failed:
        return {"outcome": "failed", "failed_check": failed, "move": move,
                "authorization": allowed["authorization"], "approver": consent.approver}
    retired = retire(run)
    return {"outcome": "refreshed", "move": move, "retired": retired, "tls": tls,
            "authorization": allowed["authorization"], "approver": consent.approver}


def new_box_ready(run: RefreshRun, consent: Consent, domain: dict[str, Any]) -> dict[str, Any]:
    """Steps 2-3 for the new box (it serves nothing yet: installed as soon as the refresh is
    approved, not in the store's window), the store VM's base image on it, and both boxes'
    libvirt TLS certificates from the master's CA. {"old", "new"}: each box's TLS answer."""
    new, parts, clock = run.new, run.parts, run.clock
    install = clock.run(STEP_PXE_INSTALL_HYPERVISOR, pxe_install_hypervisor, new,
                        install_seconds=run.params["hypervisor_timeout"], consent=consent,
                        window_covered=True, salt=parts.salt, cobbler=parts.cobbler,
                        power=parts.power, hosts=parts.hosts, calendar=parts.calendar)
    clock.run(STEP_WAIT_FOR_HYPERVISOR, wait_for_hypervisor, new, parts.salt,
              timeout=run.params["hypervisor_timeout"], already_ready=install["skipped"],
              stall_timeout=run.params["hypervisor_stall_timeout"])
    images = parts.images
    image = clock.run(STEP_IMAGE, ensure_image,
                      *build_of(images, store_version(images, new.vm.image_version)),
                      images.image_cache_dir, images.image_builder)
    if domain.get("image_key") and image["key"] != domain["image_key"]:
        get_run_logger().warning("store %s: its system disk is backed by image %s, the "
                                 "store's version builds %s: the move needs the former on "
                                 "the new box", new.store_id, domain["image_key"][:12],
                                 image["key"][:12])
    clock.run(STEP_STAGE_BASE, stage_image, new, image, parts.salt, images)
    return {side: clock.run(f"{STEP_TLS}_{side}", ensure_libvirt_tls, box, parts.salt,
                            run.refresh)
            for side, box in (("old", run.old), ("new", new))}


def moved(run: RefreshRun, new_address: str) -> tuple[dict[str, Any], str]:
    """The VM moved (resumable: a rerun finds it where it is), its minion back from the new
    box, the go-live gate there: (the move's answer, "" when all passed, else the failed
    check and why)."""
    old, new, salt, clock, step = run.old, run.new, run.parts.salt, run.clock, STEP_MOVE
    move: dict[str, Any] = {}
    try:
        move = clock.run(step, move_store_vm, old, new, salt, run.refresh, new_address)
        step = STEP_VM_BACK
        clock.run(step, wait_vm_back, new, salt, run.params["vm_back_timeout"])
        step = STEP_GO_LIVE
        clock.run(step, go_live_gate, new, salt)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the old box as it is
        return move, f"{CHECKS[step]}: {exc}"
    return move, ""


def retire(run: RefreshRun) -> dict[str, Any]:
    """The old box retired, after the new box's gate passed: the VM's leftovers removed from it
    (only while the new box runs the VM), its own hypervisor key deleted (never the VM's),
    its Cobbler record removed, powered off through its BMC."""
    old, new, parts = run.old, run.new, run.parts
    return run.clock.run(STEP_RETIRE, lambda: {
        "forgot": forget_moved_vm(old, new, parts.salt),
        "keys": delete_old_hypervisor_key(old, new, parts.salt),
        "cobbler": remove_hypervisor_record(old, parts.cobbler),
        "power": power_off_hypervisor(old, parts.power),
        # its certificate's address free for another box (a reused static address)
        "tls_freed": forget_address(ca_dir_of(run.refresh), old.hypervisor_minion_id)})


def ended(run: RefreshRun, decision: RefreshDecision,
          done: dict[str, Any]) -> dict[str, Any] | State:
    """The ERP told (a refreshed store: once per store and new box), the run's result and
    artifact, the audit trail's record; a failed move or check ends Failed naming it."""
    old, new, parts = run.old, run.new, run.parts
    if done["outcome"] in ("refreshed", "already"):
        done["erp"] = notify_erp_refreshed(new, old.hypervisor.mac, done.get("move") or {},
                                           parts.erp)
    result = {"store_id": old.store_id, "action": Action.REFRESH_HARDWARE.value,
              "old_minion": old.hypervisor_minion_id, "new_minion": new.hypervisor_minion_id,
              "vm_minion": new.vm_minion_id, "reason": decision.reason,
              "step_seconds": dict(run.clock.seconds), "inventory": inventory_update(new),
              **done}
    create_markdown_artifact(key=f"hardware-refresh-{old.store_id.lower()}",
                             markdown=report(old.store_id, result),
                             description=f"store {old.store_id} hardware refresh")
    if done["outcome"] == "already":
        return result
    authorization = done.get("authorization") or {}
    record(parts.approvals, old.store_id, Action.REFRESH_HARDWARE.value,
           done.get("approver", ""), done["outcome"],
           f"{old.hypervisor_minion_id} -> {new.hypervisor_minion_id}; "
           + (guard.describe(authorization) if authorization else decision.reason))
    if done["outcome"] == "failed":
        return Failed(message=f"store {old.store_id}: hardware refresh failed: "
                              f"{done['failed_check']}; the old box "
                              f"{old.hypervisor_minion_id} is NOT retired (on an offline move "
                              "it still holds the VM's disks); rerun to go on")
    return result
