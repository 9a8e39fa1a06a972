"""One store: image -> PXE hypervisor -> hypervisor ready -> VM keys -> VM -> firstboot ->
go-live gate -> ERP.

Wiring only; every integration lives in `tasks/`.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Any

from prefect import State, flow, tags
from prefect.artifacts import create_markdown_artifact
from prefect.states import Completed

from flows.store_rollback import store_rollback
from store_rollout.approval_policy import NOT_APPROVED, REJECTED, tightened
from store_rollout.contracts import (
    STEP_CREATE_VM,
    STEP_FIRSTBOOT,
    STEP_GO_LIVE,
    STEP_IMAGE,
    STEP_NOTIFY_ERP,
    STEP_PREPARE_VM_KEYS,
    STEP_PXE_INSTALL_HYPERVISOR,
    STEP_WAIT_FOR_HYPERVISOR,
)
from store_rollout.image_versions import build_of, store_version
from store_rollout.inventory import load_inventory
from store_rollout.inventory.replacement import with_new_box
from store_rollout.results import rollout_result
from store_rollout.settings import load_settings
from store_rollout.settings_backup import BackupPart
from store_rollout.settings_parts import ApprovalSettings, SettingsParts
from store_rollout.step_timeouts import STEP_TIMEOUTS
from store_rollout.steps import StepClock, markdown_report
from tasks.approvals import approve_rollout, asked_actions, proven_yes, rollout_consent
from tasks.audit import record
from tasks.erp import notify_erp, notify_erp_replaced
from tasks.firstboot import firstboot
from tasks.go_live import go_live_gate
from tasks.kiwi import ensure_image
from tasks.notifications import end_hypervisor_wait, notify_failure
from tasks.observe import plan_for_approval
from tasks.preflight import preflight
from tasks.pxe_install import pxe_install_hypervisor
from tasks.retire_box import retire_old_box
from tasks.run_health import beating, this_flow_run
from tasks.salt_master import prepare_vm_keys, wait_for_hypervisor
from tasks.slots import ReleasableSlot, in_flight_slots, store_owner
from tasks.store_backup import restore_newest_backup
from tasks.virt import create_vm
from tasks.windows import run_in_window


def stop_on_cancel(flow: Any, flow_run: Any, state: Any) -> None:
    """A cancelled rollout stops: it never destroys a live store (one the ERP knows, ready
    or replaced and not decommissioned), nor one whose liveness cannot be read; only the
    half-made VM of a store that never went live is cleaned (store_rollback's unfinished
    clean-up). Undoing a live store is `rollback`: asked by name, approved, in its window."""
    params = flow_run.parameters
    end_hypervisor_wait(params["store_id"])
    store_rollback(params["store_id"], params["inventory"], own_store=False,
                   unfinished_only=True, asked_by=f"the cancel of run {flow_run.name}")


@flow(name="store-rollout", flow_run_name="rollout-{store_id}", on_cancellation=[stop_on_cancel],
      on_failure=[notify_failure])
@beating
def store_rollout(store_id: str, inventory: str,
                  hypervisor_timeout: float = STEP_TIMEOUTS.hypervisor_timeout,
                  firstboot_timeout: float = STEP_TIMEOUTS.firstboot_timeout,
                  vm_stall_timeout: float = STEP_TIMEOUTS.vm_stall_timeout,
                  hypervisor_stall_timeout: float = STEP_TIMEOUTS.hypervisor_stall_timeout,
                  vm_contact_timeout: float = STEP_TIMEOUTS.vm_contact_timeout,
                  owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                  ignore_windows: bool = False, hold_fleet_slot: bool = False,
                  recreate_vm: bool = False, reinstall_hypervisor: bool = False,
                  approval_policy: str | None = None,
                  approval_timeout: float | None = None,
                  replace_box: dict[str, Any] | None = None,
                  approver: str = "", code: str = "") -> dict[str, Any] | State:
    """Roll out one store, from hardware on site to a running store server known to the ERP.

    Args:
        store_id: The store to roll out, as written in the inventory (e.g. 0001). A store that is
            not in the inventory fails the run at once, before anything is touched.
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        hypervisor_timeout: Seconds step 3 waits for the hypervisor's ready event after the PXE
            install (power on, install, first highstate).
        firstboot_timeout: Seconds step 6 waits for the store VM's firstboot (two reboots and a
            highstate) to finish.
        vm_stall_timeout: Seconds without a sign of life from the store VM after which it is reset.
        hypervisor_stall_timeout: Seconds a hypervisor may answer without getting ready before its
            highstate is applied again.
        vm_contact_timeout: Seconds step 6 waits for the store VM's minion to contact the master
            at all (its key or any event) before it fails naming the master address the image
            was built with.
        owner_wait_seconds: Seconds to wait while another rollout or rollback of this store
            runs (UI, API, batch or CLI); then this run fails naming that run, having changed
            nothing.
        ignore_windows: Start the disruptive steps even outside the store's maintenance
            windows (an emergency); the run logs it and its result says so. Without it, a
            disruptive step that cannot finish before the window closes waits for the next
            window (the run's state AwaitingWindow says until when), then goes on.
        hold_fleet_slot: Take one of the fleet's stores-in-flight slots, and one of the
            store's region's, before starting (how a batch bounds the runs it dispatched).
        recreate_vm: Remove the store's VM, if it exists, and create it anew on the current
            image (in step 5, in a maintenance window): destructive, so approved first under
            the "destructive" and "always" policies.
        reinstall_hypervisor: Reinstall the store's host even though it is installed and
            ready (in step 2, in a maintenance window): its disk, the store server VM on it
            included, is wiped, and the steps after it run as for a new host (a new VM, key
            and ERP notice). Destructive, so approved first like recreate_vm; a retry of the
            same run that finds the host reinstalled since the run began does not reinstall
            it again.
        approval_policy: When the run asks for an approval on its page first: never,
            destructive (before destroying something that works) or always (before any
            change); empty: the approval_policy setting. Only a stricter policy than the
            setting is taken: a weaker one fails the run before it changes anything. A
            rejected run ends as Rejected, having changed nothing.
        replace_box: The store's new box, replacing a broken one (`store-rollout replace`):
            its `mac` and, where they differ, `power_type`, `power_address`, `power_port`,
            `redfish_system_id`, `bmc_credentials_block`, `ipmi_cipher_suite`, `serial`. The
            old box is powered off and the store's keys deleted, the Cobbler record moves to
            the new MAC, the new box is installed and the store VM created on it from the
            image, its data disk restored from the store's newest backup after firstboot
            (when backups are configured; none: it starts empty; the result's
            `restored_backup` says which and how old); the ERP gets the new VM's notice and a
            "replaced" one. Destructive, so
            approved first like reinstall_hypervisor. Then write the new box into the
            inventory.
        approver: The approver who confirmed a destructive run at a terminal (`store-rollout
            replace --yes`), proven by `code`: the approval; the run does not pause for one.
        code: The approver's one-time code, checked by this run and used up (a wrong one
            fails the run before it changes anything).
        approval_timeout: Seconds the run waits paused for the answer before it is parked
            (suspended, resumable from its page); empty: the approval_timeout_seconds setting.
    """
    # validated before any side effect
    stores = load_inventory(inventory)
    old_box = store = stores.get(store_id)
    if replace_box:
        store = with_new_box(stores, store_id, replace_box)
    settings = load_settings()
    policy = tightened(settings.approval_policy, approval_policy)
    preflight([store], settings)
    clock = StepClock(store_id)
    # taken after the approval and given back while a step waits for its window: a run that
    # only waits holds none of the fleet's in-flight slots
    slot = ReleasableSlot(in_flight_slots(store.region)) if hold_fleet_slot else None
    with store_owner(store_id, owner_wait_seconds, this_flow_run()), \
            tags(f"store-{store_id}", "store-rollout"):
        asked = asked_actions(recreate_vm, reinstall_hypervisor, bool(replace_box))
        approval = (proven_yes(store_id, asked, approver, code, ApprovalSettings.of(settings))
                    if approver or code
                    else approve_rollout(store, policy,
                                         approval_timeout or settings.approval_timeout_seconds,
                                         partial(plan_for_approval, settings=settings,
                                                 install_seconds=hypervisor_timeout),
                                         ApprovalSettings.of(settings), recreate_vm=recreate_vm,
                                         reinstall_hypervisor=reinstall_hypervisor,
                                         replace_box=bool(replace_box)))
        if approval.get("not_approved"):  # no answer, and a run of the CLI cannot be parked
            return Completed(name=NOT_APPROVED, message=approval["comment"])
        if not approval["approved"]:
            return Completed(name=REJECTED, message=f"store {store_id}: rejected by the "
                             f"approver ({approval['comment'] or 'no comment'}); nothing changed")
        consent = rollout_consent(policy, approval, ignore_windows=ignore_windows,
                                  recreate_vm=recreate_vm,
                                  reinstall_hypervisor=reinstall_hypervisor,
                                  replace_box=bool(replace_box))
        held = slot if slot is not None else nullcontext()
        with held:
            result = _steps(store, old_box, settings, clock, consent, slot, approval,
                            replace_box=replace_box, hypervisor_timeout=hypervisor_timeout,
                            hypervisor_stall_timeout=hypervisor_stall_timeout,
                            firstboot_timeout=firstboot_timeout,
                            vm_stall_timeout=vm_stall_timeout,
                            vm_contact_timeout=vm_contact_timeout)
        if consent.asked:  # the destructive actions it was approved for are done
            record(ApprovalSettings.of(settings), store_id, asked, consent.approver, "done",
                   "rollout completed")
    create_markdown_artifact(key=f"rollout-{store_id}", markdown=markdown_report(store_id, result),
                             description=f"store {store_id} rollout")
    return result


def _steps(store: Any, old_box: Any, settings: Any, clock: StepClock, consent: Any, slot: Any,
           approval: dict[str, Any], *, replace_box: dict[str, Any] | None,
           hypervisor_timeout: float, hypervisor_stall_timeout: float, firstboot_timeout: float,
           vm_stall_timeout: float, vm_contact_timeout: float) -> dict[str, Any]:
    """Steps 1 to 7 of an approved rollout (the slot given back while a step waits)."""
    store_id = store.store_id
    # each task gets the part of the settings it uses (store_rollout/settings_parts.py)
    parts = SettingsParts.of(settings)
    images = parts.images
    # the version the store should run (store_rollout/image_versions.py)
    description, params = build_of(images, store_version(images, store.vm.image_version))
    image = clock.run(STEP_IMAGE, ensure_image, description, params, images.image_cache_dir,
                      images.image_builder)
    retired = (run_in_window(store_id, lambda: retire_old_box(
        old_box, store, consent, salt=parts.salt, cobbler=parts.cobbler, power=parts.power,
        calendar=parts.calendar),
        slot) if replace_box else None)
    install = run_in_window(store_id, lambda: clock.run(
        STEP_PXE_INSTALL_HYPERVISOR, pxe_install_hypervisor, store,
        install_seconds=hypervisor_timeout, consent=consent,
        window_covered=bool(retired and retired.get("authorization")), salt=parts.salt,
        cobbler=parts.cobbler, power=parts.power, hosts=parts.hosts, calendar=parts.calendar),
        slot)
    hv_wait = clock.run(STEP_WAIT_FOR_HYPERVISOR, wait_for_hypervisor, store, parts.salt,
                        timeout=hypervisor_timeout, already_ready=install["skipped"],
                        stall_timeout=hypervisor_stall_timeout)
    keys = clock.run(STEP_PREPARE_VM_KEYS, prepare_vm_keys, store, parts.salt, parts.cobbler)
    # step 2 started an install in a window with room for steps 2 to 5: step 5 goes on
    installed_now = bool(install["power_actions"]) and not install["silent"]
    vm = run_in_window(store_id, lambda: clock.run(
        STEP_CREATE_VM, create_vm, store, image, consent=consent,
        window_covered=installed_now, salt=parts.salt, hosts=parts.hosts, images=images,
        calendar=parts.calendar), slot)
    booted = clock.run(STEP_FIRSTBOOT, firstboot, store, parts.salt, images,
                       timeout=firstboot_timeout, stall_timeout=vm_stall_timeout,
                       contact_timeout=vm_contact_timeout)
    # a replacement's data disk: the store's newest backup, before the gate checks the store
    restored = (restore_newest_backup(store, parts.salt, BackupPart.of(settings))
                if replace_box else None)
    go_live = clock.run(STEP_GO_LIVE, go_live_gate, store, parts.salt)
    erp = clock.run(STEP_NOTIFY_ERP, notify_erp, store, vm, parts.erp)
    replaced = (notify_erp_replaced(store, old_box.hypervisor.mac, parts.erp) if replace_box
                else None)
    return {**rollout_result(store, image=image, install=install, retired=retired,
                             hv_wait=hv_wait, keys=keys, vm=vm, booted=booted, go_live=go_live,
                             erp=erp, replaced=replaced, approval=approval,
                             step_seconds=clock.seconds), "restored_backup": restored}


if __name__ == "__main__":
    import sys

    print(store_rollout(sys.argv[1], sys.argv[2]))
