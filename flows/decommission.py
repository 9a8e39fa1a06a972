"""Close a store: its VM and disks, its two keys, its Cobbler record, its host's power, the ERP.
The data disk goes too, after an export of it is kept on this host (tasks/data_export.py)
unless the run is told not to (`keep_export`).

Wiring only; every step is idempotent, so a rerun (or a run resumed after a failure) does what
is left and replays the ERP's notice.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, tags

from store_rollout import data_disk, guard
from store_rollout.approval_policy import check_policy
from store_rollout.guard import Action
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import SettingsParts
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.approvals import undo_consent
from tasks.audit import record
from tasks.bmc import power_off_hypervisor
from tasks.cobbler import remove_hypervisor_record
from tasks.data_export import export_data_disk
from tasks.erp import notify_erp_decommissioned
from tasks.notifications import notify_failure
from tasks.preflight import check_region
from tasks.run_health import beating, this_flow_run
from tasks.salt_master import remove_store_keys
from tasks.slots import store_owner
from tasks.undo import undo_decision
from tasks.vm_removal import remove_vm


@flow(name="store-decommission", flow_run_name="decommission-{store_id}", on_failure=[notify_failure])
@beating
def store_decommission(store_id: str, inventory: str,
                       owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                       approver: str = "", code: str = "", asked_by: str = "",
                       ignore_windows: bool = False, keep_export: bool = True) -> dict[str, Any]:
    """Close a store for good: nothing of it is left in libvirt, Salt or Cobbler, its host is
    off and the ERP is told; its data disk is removed, an export of it kept first (unless
    `keep_export` is false). `reconcile` then reports the store as decommissioned. Only as the
    guard (store_rollout/guard.py) lets it: approved under the approval policy, in the store's
    window, unless `ignore_windows`.

    Args:
        store_id: The store to close, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        owner_wait_seconds: Seconds to wait while a rollout or rollback of this store runs; then
            this run fails naming that run, having changed nothing.
        approver: The approver who confirmed the decommission at a terminal (`--yes`), proven
            by `code`: the approval. Empty: the run asks on its page (unless the policy is
            never).
        code: The approver's one-time code, checked by this run and used up (a wrong one
            fails the run before it changes anything).
        asked_by: Who asked for it (recorded with the guard's decision).
        ignore_windows: Decommission outside the store's maintenance window.
        keep_export: Keep an export of the store's data disk (in the `data_export_dir`
            setting's directory, with its sha256) before the disk is removed; false
            (`--no-export`): the data disk goes without one, its data gone for good.
    """
    store = load_inventory(inventory).get(store_id)
    settings = load_settings()
    check_region(store, settings)
    parts = SettingsParts.of(settings)
    images = parts.hosts.vm_images_dir
    fate = data_disk.decommission_note(store, data_disk.data_disk_path(store, images),
                                       keep_export, parts.salt.data_export_dir)
    consent = undo_consent(store, Action.DECOMMISSION, check_policy(settings.approval_policy),
                           settings.approval_timeout_seconds, parts.approvals,
                           asked_by=asked_by or f"run decommission-{store_id}",
                           approver=approver, code=code, ignore_windows=ignore_windows,
                           consequence=fate)
    decision = undo_decision(Action.DECOMMISSION, store, consent, parts.calendar, fate)
    with store_owner(store_id, owner_wait_seconds, this_flow_run()), \
            tags(f"store-{store_id}", "store-decommission"):
        # the data disk's export and the VM while the host answers; the host off before its
        # key goes (a running minion whose key is deleted signs in again, leaving a pending
        # key); its record last
        export = export_data_disk(store, parts.salt, keep_export)
        vm = remove_vm(store, parts.salt, images, host_may_be_gone=True, keep_data=False)
        power = power_off_hypervisor(store, parts.power)
        keys = remove_store_keys(store, parts.salt)
        cobbler = remove_hypervisor_record(store, parts.cobbler)
        erp = notify_erp_decommissioned(store, parts.erp)
    record(parts.approvals, store_id, Action.DECOMMISSION.value, consent.approver, "done",
           guard.describe(decision.record))
    return {"store_id": store_id, "state": "Decommissioned", "vm": vm, "keys": keys,
            "cobbler": cobbler, "power": power, "erp_id": erp["erp_id"],
            "erp_replayed": erp["replay"], "data_export": export,
            "authorization": decision.record}
