"""Revert one store server to the system disk it ran before its last image update (issue 47):
asked for by name (`store-rollout revert STORE`), approved as the approval policy says, in the
store's window, one owner per store: shut down, back on the previous system disk (the host's
update record names it; kept `image_keep_previous_hours` after a committed update), booted, its
minion back, its go-live gate passing. Wiring only.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact

from flows.image_update import back_to_previous, prepared
from store_rollout import guard
from store_rollout.guard import Action
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.step_timeouts import STEP_TIMEOUTS
from store_rollout.updates import (
    REVERT_DOWN_STEPS,
    STEP_STATE,
    VM_BACK_TIMEOUT,
    decide_revert,
    report,
    seconds_of,
)
from tasks.audit import record
from tasks.image_update import read_update_state, update_window
from tasks.notifications import notify_failure
from tasks.run_health import beating, this_flow_run
from tasks.slots import store_owner
from tasks.windows import run_in_window


@flow(name="store-image-revert", flow_run_name="revert-{store_id}", on_failure=[notify_failure])
@beating
def store_image_revert(store_id: str, inventory: str, ignore_windows: bool = False,
                       approval_policy: str | None = None, approval_timeout: float | None = None,
                       approver: str = "", code: str = "", asked_by: str = "",
                       owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                       vm_back_timeout: float = VM_BACK_TIMEOUT,
                       shutdown_timeout: float | None = None) -> dict[str, Any]:
    """Back to the version before the store's last image update (see the module). Fails
    before any change when the store is not live or its host holds no update record.

    Args:
        store_id: The store, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host.
        ignore_windows: Go outside the store's maintenance window (an emergency; only with a
            proven approver).
        approval_policy: Stricter than the setting only; `always` asks on the run's page.
        approval_timeout: Seconds the run waits paused for the answer before it is parked.
        approver: The approver who confirmed it at a terminal (`--yes`), proven by `code`.
        code: The approver's one-time code, checked by this run and used up.
        asked_by: Who asked for it (recorded with the guard's decision).
        owner_wait_seconds: Seconds to wait while another run owns the store.
        vm_back_timeout: Seconds to wait after the boot for the VM's minion to answer.
        shutdown_timeout: Seconds the VM has to shut down through its OS before it is cut
            off; empty: the graceful_shutdown_seconds setting.
    """
    run = prepared(load_inventory(inventory).get(store_id), load_settings(), Action.REVERT_IMAGE,
                   approval_policy=approval_policy,
                   approval_timeout=approval_timeout, approver=approver, code=code,
                   asked_by=asked_by, ignore_windows=ignore_windows,
                   vm_back_timeout=vm_back_timeout, shutdown_timeout=shutdown_timeout)
    with store_owner(store_id, owner_wait_seconds, this_flow_run()), \
            tags(f"store-{store_id}", "store-image-revert"):
        found = run.clock.run(STEP_STATE, read_update_state, run.store, run.parts.salt,
                              run.parts.erp)
        previous = found["record"] or {}
        result = {"store_id": store_id, "action": "revert", "outcome": "already",
                  "from_version": found["running_version"],
                  "to_version": previous.get("from_version")}
        if decide_revert(found["record"], store_id) == "revert":
            consent = run.consent(Action.REVERT_IMAGE)
            allowed = run_in_window(store_id, lambda: update_window(
                Action.REVERT_IMAGE, run.store, consent, run.parts.calendar))
            gate = back_to_previous(run)
            record(run.parts.approvals, store_id, Action.REVERT_IMAGE.value, consent.approver,
                   "reverted", f"back on {previous.get('from')}; "
                   + guard.describe(allowed["authorization"]))
            result.update(outcome="reverted", go_live=gate, disk=previous.get("from"),
                          authorization=allowed["authorization"])
        get_run_logger().warning("store %s: %s", store_id, "reverted to its previous system "
                                 "disk" if result["outcome"] == "reverted" else "already reverted")
    result.update(downtime_seconds=seconds_of(run.clock.seconds, REVERT_DOWN_STEPS),
                  step_seconds=dict(run.clock.seconds))
    create_markdown_artifact(key=f"image-revert-{store_id.lower()}",
                             markdown=report(store_id, result),
                             description=f"store {store_id} image revert")
    return result


if __name__ == "__main__":
    import sys

    print(store_image_revert(sys.argv[1], sys.argv[2]))
