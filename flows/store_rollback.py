"""Undo a store rollout: VM destroyed and undefined, its system disk removed (its data disk
kept: only a decommission removes it, store_rollout/data_disk.py), VM key deleted, Cobbler
netboot off. Runs on request (`store-rollout rollback --yes`, or the deployment: approved on its
page), through the guard (store_rollout/guard.py); a cancelled rollout runs only its
unfinished clean-up, which never touches a store that went live."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from prefect import flow, tags

from store_rollout import data_disk, guard
from store_rollout.approval_policy import check_policy
from store_rollout.guard import Action, Consent
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import SettingsParts
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.approvals import undo_consent
from tasks.audit import record
from tasks.cobbler import disable_hypervisor_netboot
from tasks.notifications import notify_failure
from tasks.preflight import check_region
from tasks.run_health import beating, this_flow_run
from tasks.salt_master import remove_vm_key
from tasks.slots import store_owner
from tasks.undo import cancel_leaves_as_is, undo_decision
from tasks.vm_removal import VmLeftOnSilentHost, remove_vm


@flow(name="store-rollback", flow_run_name="rollback-{store_id}", on_failure=[notify_failure])
@beating
def store_rollback(store_id: str, inventory: str,
                   owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                   own_store: bool = True, unfinished_only: bool = False,
                   approver: str = "", code: str = "", asked_by: str = "",
                   ignore_windows: bool = False) -> dict[str, Any]:
    """Reverse order of the rollout; every step is idempotent. It destroys a store server:
    it goes on only as the guard lets it (approved under the approval policy, in the store's
    window with room for it, unless `ignore_windows`).

    Args:
        store_id: The store to roll back, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        owner_wait_seconds: Seconds to wait while a rollout or another rollback of this store
            runs; then this run fails naming that run, having changed nothing.
        own_store: False only for the clean-up a cancelled rollout runs for itself (the
            rollout owned the store).
        unfinished_only: The clean-up of a cancelled rollout: only a store that never went
            live (the ERP knows nothing of it) loses its half-made VM; a live store, or one
            whose ERP record cannot be read, is left as it is.
        approver: The approver who confirmed the rollback at a terminal (`--yes`), proven by
            `code`: the approval. Empty: the run asks on its page (unless the policy is never).
        code: The approver's one-time code, checked by this run and used up (a wrong one
            fails the run before it changes anything).
        asked_by: Who asked for it (recorded with the guard's decision).
        ignore_windows: Roll back outside the store's maintenance window (an emergency).
    """
    store = load_inventory(inventory).get(store_id)
    settings = load_settings()
    check_region(store, settings)
    parts = SettingsParts.of(settings)
    if unfinished_only:
        left = cancel_leaves_as_is(store_id, parts.erp, parts.approvals)
        if left:
            return {"store_id": store_id, "left_as_is": left}
        action, consent = Action.CLEAN_UNFINISHED, Consent(asked_by=asked_by or "a cancel")
    else:
        action = Action.ROLLBACK
        consent = undo_consent(store, action, check_policy(settings.approval_policy),
                               settings.approval_timeout_seconds, parts.approvals,
                               asked_by=asked_by or f"run rollback-{store_id}",
                               approver=approver, code=code, ignore_windows=ignore_windows)
    decision = undo_decision(action, store, consent, parts.calendar, data_disk.kept(
        store.hypervisor_minion_id, data_disk.data_disk_path(store, parts.hosts.vm_images_dir)))
    what = "cancel" if unfinished_only else action.value
    owner = (store_owner(store_id, owner_wait_seconds, this_flow_run()) if own_store
             else nullcontext())
    with owner, tags(f"store-{store_id}", "store-rollback"):
        # a cancelled run may have stopped before its host was installed: not asked then
        vm = remove_vm(store, parts.salt, parts.hosts.vm_images_dir,
                       host_may_be_gone=unfinished_only, keep_data=True,
                       silent_host_fails=unfinished_only)
        key = remove_vm_key(store, parts.salt)
        cobbler = disable_hypervisor_netboot(store, parts.cobbler)
    silent = vm.get("host_silent")
    record(parts.approvals, store_id, what, consent.approver,
           f"VM left on the silent host {silent}" if silent else "done",
           f"{action.value}; {guard.describe(decision.record)}")
    if silent:  # its key and netboot are undone; the VM waits for a rollback that finds it
        raise VmLeftOnSilentHost(store_id, silent, store.vm_name)
    return {"store_id": store_id, "vm": vm, "key": key, "cobbler": cobbler,
            "authorization": decision.record}
