"""Update one live store server to a new image version (issue 47): the new base image and a new
system disk staged on its host ahead of the window; in the store's window, under the guard
(asked for by name, approved as the policy says, one owner per store): shut down, switch the
system disk (the host records it first), boot, the VM's minion back, the update highstate, the
version the VM reports, the go-live gate. All pass: committed (the old disk kept for a manual
revert) and the ERP told once. One fails: back to the old disk by itself, booted and gated
again, and the run ends Failed naming the check; the ERP hears nothing. A rerun after a crash
finishes a switch the host's record shows uncommitted.

Wiring only; what it decides is store_rollout/updates.py's, what it changes tasks/'.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefect import State, flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from store_rollout import guard
from store_rollout.approval_policy import tightened
from store_rollout.contracts import STEP_IMAGE, STEP_NOTIFY_ERP
from store_rollout.guard import Action, Consent
from store_rollout.image_versions import build_of
from store_rollout.inventory import Store, load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import SettingsParts
from store_rollout.step_timeouts import STEP_TIMEOUTS
from store_rollout.steps import StepClock
from store_rollout.updates import (
    DOWN_STEPS,
    REVERT_DOWN_STEPS,
    STEP_BOOT,
    STEP_COMMIT,
    STEP_GO_LIVE,
    STEP_REVERT,
    STEP_REVERT_BOOT,
    STEP_REVERT_GO_LIVE,
    STEP_REVERT_VM_BACK,
    STEP_SHUTDOWN,
    STEP_STAGE,
    STEP_STATE,
    STEP_SWITCH,
    STEP_UPDATE_HIGHSTATE,
    STEP_VERSION,
    STEP_VM_BACK,
    VM_BACK_TIMEOUT,
    RevertFailed,
    UpdateDecision,
    decide_update,
    failed_check,
    report,
    reverted_message,
    seconds_of,
    target_version,
)
from tasks.approvals import update_consent
from tasks.audit import record
from tasks.erp import notify_erp_image_updated
from tasks.go_live import go_live_gate
from tasks.image_update import (
    boot_vm,
    check_version,
    commit_update,
    read_update_state,
    revert_disk,
    shutdown_vm,
    stage_update,
    switch_disk,
    update_highstate,
    update_window,
    wait_vm_back,
)
from tasks.kiwi import ensure_image
from tasks.notifications import notify_failure
from tasks.preflight import check_region
from tasks.run_health import beating, this_flow_run
from tasks.slots import ReleasableSlot, in_flight_slots, store_owner
from tasks.windows import run_in_window


@dataclass(frozen=True)
class UpdateRun:
    """What the steps of one store's update (or revert) share; `consent(action)` asks for the
    run's consent to an action (tasks/approvals.update_consent, with the run's parameters)."""

    store: Store
    parts: SettingsParts
    clock: StepClock
    consent: Callable[[Action], Consent]
    vm_back_timeout: float
    shutdown_timeout: float


def prepared(store: Store, settings: Any, action: Action, *, approval_policy: str | None,
             approval_timeout: float | None, approver: str, code: str, asked_by: str,
             ignore_windows: bool, vm_back_timeout: float,
             shutdown_timeout: float | None) -> UpdateRun:
    """The store and settings checked (before any change), and how the run asks for its
    consent: by name (this run or the command), approved as the approval policy says (an
    update destroys nothing: under `destructive` nobody is asked; `always` asks on the run's
    page)."""
    check_region(store, settings)
    parts = SettingsParts.of(settings)
    consent = partial(update_consent, store,
                      policy=tightened(settings.approval_policy, approval_policy),
                      timeout=approval_timeout or settings.approval_timeout_seconds,
                      settings=parts.approvals,
                      asked_by=asked_by or f"run {action.value}-{store.store_id}",
                      approver=approver, code=code, ignore_windows=ignore_windows)
    return UpdateRun(store, parts, StepClock(store.store_id), consent, vm_back_timeout,
                     shutdown_timeout or parts.power.graceful_shutdown_seconds)


@flow(name="store-image-update", flow_run_name="update-{store_id}", on_failure=[notify_failure])
@beating
def store_image_update(store_id: str, inventory: str, image_version: str = "",
                       ignore_windows: bool = False, hold_fleet_slot: bool = False,
                       approval_policy: str | None = None, approval_timeout: float | None = None,
                       approver: str = "", code: str = "", asked_by: str = "",
                       owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                       vm_back_timeout: float = VM_BACK_TIMEOUT,
                       shutdown_timeout: float | None = None) -> dict[str, Any] | State:
    """Update one live store server to a new image version, in its window (see the module).

    Args:
        store_id: The store, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host.
        image_version: The version to run (one of the settings' image_versions); empty: the
            store's inventory vm.image_version, else the chain's image_version.
        ignore_windows: Go outside the store's maintenance window (an emergency; only with a
            proven approver).
        hold_fleet_slot: Take one of the fleet's stores-in-flight slots, and one of the
            store's region's, while it disrupts the store (how a batch bounds its runs).
        approval_policy: Stricter than the setting only; `always` asks on the run's page.
        approval_timeout: Seconds the run waits paused for the answer before it is parked.
        approver: The approver who confirmed it at a terminal (`--yes`), proven by `code`.
        code: The approver's one-time code, checked by this run and used up.
        asked_by: Who asked for it (recorded with the guard's decision).
        owner_wait_seconds: Seconds to wait while another run owns the store.
        vm_back_timeout: Seconds to wait after a boot for the VM's minion to answer with its
            accepted key; then the new version counts as failed (and is reverted).
        shutdown_timeout: Seconds the VM has to shut down through its OS before it is cut
            off; empty: the graceful_shutdown_seconds setting.
    """
    run = prepared(load_inventory(inventory).get(store_id), load_settings(), Action.UPDATE_IMAGE,
                   approval_policy=approval_policy,
                   approval_timeout=approval_timeout, approver=approver, code=code,
                   asked_by=asked_by, ignore_windows=ignore_windows,
                   vm_back_timeout=vm_back_timeout, shutdown_timeout=shutdown_timeout)
    images = run.parts.images
    version = target_version(images, image_version, run.store.vm.image_version)
    slot = ReleasableSlot(in_flight_slots(run.store.region)) if hold_fleet_slot else None
    with store_owner(store_id, owner_wait_seconds, this_flow_run()), \
            tags(f"store-{store_id}", "store-image-update"):
        image = run.clock.run(STEP_IMAGE, ensure_image, *build_of(images, version),
                              images.image_cache_dir, images.image_builder)
        found = run.clock.run(STEP_STATE, read_update_state, run.store, run.parts.salt,
                              run.parts.erp)
        decision = decide_update(found["record"], found["domain"], found["running_version"],
                                 version, image["key"])
        get_run_logger().warning("store %s: %s", store_id, decision.reason)
        if decision.action == "already":
            return ended(run, decision, {"outcome": "already"})
        with slot if slot is not None else nullcontext():
            done = (finish(run, decision) if decision.action == "finish"
                    else update(run, decision, image, slot))
    return ended(run, decision, done)


def update(run: UpdateRun, decision: UpdateDecision, image: Any, slot: Any) -> dict[str, Any]:
    """Staged ahead of the window (the guard asked first: a refusal stages nothing), then in
    the window: shutdown and switch, and the new version's checks."""
    store, salt, clock = run.store, run.parts.salt, run.clock
    consent = run.consent(Action.UPDATE_IMAGE)
    update_window(Action.UPDATE_IMAGE, store, consent, run.parts.calendar)
    staged = clock.run(STEP_STAGE, stage_update, store, image, salt, run.parts.images)
    allowed = run_in_window(store.store_id, lambda: update_window(
        Action.UPDATE_IMAGE, store, consent, run.parts.calendar), slot)
    clock.run(STEP_SHUTDOWN, shutdown_vm, store, salt, run.shutdown_timeout)
    clock.run(STEP_SWITCH, switch_disk, store, salt, staged["disk"], decision.to_version)
    return {**on_new_version(run, decision), "authorization": allowed["authorization"],
            "approver": consent.approver, "disk": staged["disk"]}


def finish(run: UpdateRun, decision: UpdateDecision) -> dict[str, Any]:
    """A switch a crashed run recorded and never committed: made again if the domain still has
    its old disk, then the new version's checks (commit, or revert)."""
    store, salt = run.store, run.parts.salt
    allowed = update_window(Action.FINISH_UPDATE, store, Consent(asked_by=f"the rerun of "
                            f"store {store.store_id}'s update"), run.parts.calendar)
    if decision.switch_again:
        run.clock.run(STEP_SHUTDOWN, shutdown_vm, store, salt, run.shutdown_timeout)
        run.clock.run(STEP_SWITCH, switch_disk, store, salt, decision.disk, decision.to_version)
    return {**on_new_version(run, decision), "authorization": allowed["authorization"],
            "disk": decision.disk, "resumed": True}


def on_new_version(run: UpdateRun, decision: UpdateDecision) -> dict[str, Any]:
    """The new version's checks; all passed: committed and the ERP told; one failed: back on
    the previous system disk (outcome reverted, the failed check named)."""
    store, parts = run.store, run.parts
    booted, failed = checked(run, decision.to_version)
    if failed:
        get_run_logger().error("store %s: %s; reverting to %s", store.store_id, failed,
                               decision.from_version)
        back_to_previous(run, why=reverted_message(store.store_id, decision, failed))
        return {"outcome": "reverted", "failed_check": failed}
    commit = run.clock.run(STEP_COMMIT, commit_update, store, parts.salt,
                           parts.images.image_keep_previous_hours)
    erp = run.clock.run(STEP_NOTIFY_ERP, notify_erp_image_updated, store, booted,
                        decision.to_version, decision.from_version,
                        str(booted.get("image_key") or ""), parts.erp)
    return {"outcome": "updated", "commit": commit, "erp": erp,
            "image_key": booted.get("image_key")}


def checked(run: UpdateRun, version: str) -> tuple[dict[str, Any], str]:
    """Each check of the new version in turn: (the booted domain's summary, "" when all
    passed, else the first failed check and why). Any failure counts (a VM that does not
    boot, a minion that stays silent, a highstate, version or gate that fails)."""
    store, salt, booted, step = run.store, run.parts.salt, {}, STEP_BOOT
    try:
        booted = run.clock.run(step, boot_vm, store, salt)
        step = STEP_VM_BACK
        run.clock.run(step, wait_vm_back, store, salt, run.vm_back_timeout)
        step = STEP_UPDATE_HIGHSTATE
        run.clock.run(step, update_highstate, store, salt)
        step = STEP_VERSION
        run.clock.run(step, check_version, store, salt, version)
        step = STEP_GO_LIVE
        run.clock.run(step, go_live_gate, store, salt)
    except Exception as exc:  # noqa: BLE001 - any failure of the new version reverts it
        return booted, failed_check(step, exc)
    return booted, ""


def back_to_previous(run: UpdateRun, why: str = "") -> dict[str, Any]:
    """The VM back on the record's previous system disk, booted, its minion back and its
    go-live gate passing; RevertFailed (with `why`) when that does not bring it back."""
    store, salt, clock = run.store, run.parts.salt, run.clock
    try:
        clock.run(STEP_REVERT, revert_disk, store, salt, run.shutdown_timeout)
        clock.run(STEP_REVERT_BOOT, boot_vm, store, salt)
        clock.run(STEP_REVERT_VM_BACK, wait_vm_back, store, salt, run.vm_back_timeout)
        gate: dict[str, Any] = clock.run(STEP_REVERT_GO_LIVE, go_live_gate, store, salt)
    except Exception as exc:
        raise RevertFailed(f"{why or f'store {store.store_id}: revert'}; BUT the revert did not "
                           f"bring the store server back: {exc}") from exc
    return gate


def ended(run: UpdateRun, decision: UpdateDecision, done: dict[str, Any]) -> dict[str, Any] | State:
    """The run's result and markdown artifact, the audit trail's record of what was done; a
    reverted update ends Failed naming the failed check."""
    store_id, seconds = run.store.store_id, run.clock.seconds
    result = {"store_id": store_id, "action": "update", "from_version": decision.from_version,
              "to_version": decision.to_version, "downtime_seconds": seconds_of(seconds, DOWN_STEPS),
              "revert_downtime_seconds": seconds_of(seconds, REVERT_DOWN_STEPS),
              "step_seconds": dict(seconds), "reason": decision.reason, **done}
    create_markdown_artifact(key=f"image-update-{store_id.lower()}",
                             markdown=report(store_id, result),
                             description=f"store {store_id} image update")
    if done["outcome"] == "already":
        return result
    authorization = done.get("authorization") or {}
    record(run.parts.approvals, store_id, Action.UPDATE_IMAGE.value, done.get("approver", ""),
           done["outcome"], f"{decision.from_version} -> {decision.to_version}; "
           + (guard.describe(authorization) if authorization else decision.reason))
    if done["outcome"] == "reverted":
        return Failed(message=reverted_message(store_id, decision, done["failed_check"]))
    return result


if __name__ == "__main__":
    import sys

    print(store_image_update(sys.argv[1], sys.argv[2], sys.argv[3]))
