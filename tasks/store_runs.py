"""Store rollouts as flow runs of the `store-rollout` deployment, each created Scheduled for
the start of its store's next maintenance window: a batch that follows the stores' clocks.

The runs wait on the Prefect server (Scheduled, with their start time, in the UI and the API)
and a worker of the deployment's pool starts each at its time; the batch reads their states
back to wave, halt and report. Each run is the batch's subflow run (the batch's page lists
them), created with an idempotency key, so a retried batch finds its runs instead of making
new ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import TaskRunSort
from prefect.deployments import run_deployment

from store_rollout.approval_policy import AWAITING_APPROVAL, UNAPPROVED_ENDS
from store_rollout.batch_rows import StoreRow
from store_rollout.contracts import STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.disruption import WindowDecision, decide, decide_sequence
from store_rollout.guard import Action, calendar_for, sequence_seconds
from store_rollout.inventory import Store
from store_rollout.inventory.calendar_spec import CalendarSpec
from store_rollout.settings_parts import CalendarSettings
from store_rollout.waves import ROLLOUT, UPDATE
from tasks.flow_runs import newest_rollout_runs
from tasks.run_health import this_flow_run

STORE_DEPLOYMENT: Final = "store-rollout/store-rollout"  # prefect.yaml's store-rollout
# a batch of image updates (issue 47): each store a run of prefect.yaml's store-image-update
UPDATE_DEPLOYMENT: Final = "store-image-update/store-image-update"
RUN_NAMES: Final = {ROLLOUT: "rollout-{}", UPDATE: "update-{}"}
POLL_SECONDS: Final = 5.0  # how often the batch reads its scheduled runs' states
# a run is due this long after its window opens: Prefect stamps a run's start with the time its
# process asked to start, which can be milliseconds before the server let it (seen: 20 ms)
START_MARGIN: Final = timedelta(seconds=1)


def start_time(store: Store, now: datetime, install_seconds: float,
               default_calendar: CalendarSpec | None = None) -> tuple[datetime | None, str]:
    """When the store's run is to start (None: no window within the calendar's horizon, or no
    calendar at all) and why: now when its window (its own, else the chain's default) is open
    with time for step 2 left, else its next such window's start."""
    return _start_of(decide(STEP_PXE_INSTALL_HYPERVISOR, calendar_for(store, default_calendar),
                            now, timedelta(seconds=install_seconds)), now)


def _start_of(decision: WindowDecision, now: datetime) -> tuple[datetime | None, str]:
    if decision.go:
        return now, decision.reason
    return (decision.wait_until + START_MARGIN if decision.wait_until else None), decision.reason


def update_start_time(store: Store, now: datetime, update_seconds: float,
                      default_calendar: CalendarSpec | None = None
                      ) -> tuple[datetime | None, str]:
    """As `start_time`, for a store's image update: a window with `update_seconds` left (the
    store server's restart on its new system disk, and a revert's: disruption_seconds'
    image_update)."""
    return _start_of(decide_sequence(
        "image update", "restarts the store server on a new system disk",
        calendar_for(store, default_calendar), now, timedelta(seconds=update_seconds)), now)


def _when(store: Store, params: dict[str, Any], calendar: CalendarSettings, follow_windows: bool,
          action: str) -> tuple[datetime | None, str]:
    """When the store's run of `action` starts, and why."""
    now = datetime.now(UTC)
    if not follow_windows:
        return now, "started now (" + ("ignore_windows" if params.get("ignore_windows") else
                                       "no calendar to follow") + ")"
    if action == UPDATE:  # the update's own disruption (and its revert's), as its guard asks
        return update_start_time(store, now, sequence_seconds(Action.UPDATE_IMAGE,
                                                              calendar.disruption_seconds),
                                 calendar.default_calendar)
    # room for steps 2 to 5, as step 2 itself asks (store_rollout/guard.py)
    return start_time(store, now, sequence_seconds(Action.REINSTALL_HOST,
                                                   calendar.disruption_seconds),
                      calendar.default_calendar)


@task(name="schedule_store_run", task_run_name="schedule-{store.store_id}")
def schedule_store_run(store: Store, inventory: str, params: dict[str, Any],
                       calendar: CalendarSettings, deployment: str = STORE_DEPLOYMENT,
                       follow_windows: bool = True, action: str = ROLLOUT) -> StoreRow:
    """One store's rollout (or image update, `action`) as a run of `deployment`, Scheduled for
    its window (now without `follow_windows`); the batch row of a store that has no window is
    returned Failed, no run created."""
    start, reason = _when(store, params, calendar, follow_windows, action)
    if start is None:
        return StoreRow(store_id=store.store_id, region=store.region, window=reason,
                        flow_run_id=None, scheduled_start=None, state="Failed", began=None,
                        ended=None, error=f"NoMaintenanceWindow: {reason}")
    batch = this_flow_run()
    # sync here (run_deployment also serves async callers)
    run = cast(FlowRun, run_deployment(
        deployment, parameters={"store_id": store.store_id, "inventory": inventory, **params},
        scheduled_time=start, timeout=0, flow_run_name=RUN_NAMES[action].format(store.store_id),
        idempotency_key=(f"batch-{batch}-store-{store.store_id}" if action == ROLLOUT
                         else f"batch-{batch}-{action}-{store.store_id}") if batch else None))
    get_run_logger().info("store %s: run %s of %s scheduled for %s UTC (%s)", store.store_id,
                          run.name, deployment, f"{start:%Y-%m-%d %H:%M:%S}", reason)
    return StoreRow(store_id=store.store_id, region=store.region, window=reason,
                    flow_run_id=str(run.id), scheduled_start=start.isoformat(),
                    state="Scheduled")


@task(name="find_rolled_out_stores")
def rolled_out_stores(stores: list[Store]) -> dict[str, StoreRow]:
    """The batch rows of the stores whose newest rollout run Completed: a batch leaves them be
    (a rerun of a batch goes on with the stores it did not finish)."""
    regions = {store.store_id: store.region for store in stores}
    with get_client(sync_client=True) as client:
        newest = newest_rollout_runs(client, list(regions))
    done = {sid: run for sid, run in newest.items()
            if run.state and run.state.is_completed() and run.state.name not in UNAPPROVED_ENDS}
    if done:
        get_run_logger().info("already rolled out, left as they are: %s", ", ".join(
            f"{sid} ({run.name}, {run.end_time:%Y-%m-%d %H:%M} UTC)" for sid, run in done.items()))
    return {sid: StoreRow.rolled_out_before(
                sid, regions[sid], str(run.id), f"{run.name}, ended {run.end_time:%Y-%m-%d %H:%M} UTC")
            for sid, run in done.items()}


def _step_reached(client: Any, run_id: UUID, store_id: str) -> str:
    """The step of the run's newest task run (task runs are named `<step>-<store>`)."""
    runs = client.read_task_runs(task_run_filter=TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[run_id])), sort=TaskRunSort.EXPECTED_START_TIME_DESC,
        limit=1)
    return runs[0].name.removesuffix(f"-{store_id}") if runs else "validation"


def parked(state: Any) -> bool:
    """The run waits, parked (suspended), for an approval: resumable from its page at any
    time, so a batch counts it as ended, not done (tasks/approvals.py parks it)."""
    return bool(state and state.is_paused() and state.name == "Suspended")


def _row(client: Any, scheduled: StoreRow, run: Any) -> StoreRow:
    state = run.state
    began, ended = run.start_time, run.end_time
    due = datetime.fromisoformat(scheduled.scheduled_start or "")
    if parked(state):
        from tasks.notifications import run_url

        return scheduled.model_copy(update={
            "state": AWAITING_APPROVAL, "seconds": 0,
            "step_reached": _step_reached(client, run.id, scheduled.store_id),
            "queued_seconds": round((began - due).total_seconds(), 1) if began else 0,
            "began": round(began.timestamp(), 3) if began else None, "ended": None,
            "error": f"waits, parked, for an approval on its page: {run_url(run.id)}"})
    return scheduled.model_copy(update={
        "state": state.name if state.is_final() else state.type.value,
        "step_reached": _step_reached(client, run.id, scheduled.store_id),
        "seconds": round((ended - began).total_seconds(), 1) if began and ended else 0,
        "queued_seconds": round((began - due).total_seconds(), 1) if began else 0,
        "error": "" if state.is_completed() and state.name not in UNAPPROVED_ENDS
                 else str(state.message or "")[:300],
        "began": round(began.timestamp(), 3) if began else None,
        "ended": round(ended.timestamp(), 3) if ended else None})


def ended_runs(client: Any, ids: list[UUID],
               sleep: Callable[[float], None] = time.sleep) -> dict[UUID, Any]:
    """The flow runs `ids`, read once every one of them has ended (or waits, parked, for its
    approval)."""
    while True:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        if len(runs) == len(ids) and all(r.state and (r.state.is_final() or parked(r.state))
                                         for r in runs):
            return {r.id: r for r in runs}
        sleep(POLL_SECONDS)


@task(name="wait_for_store_runs", task_run_name="wait-for-{wave_name}")
def wait_for_store_runs(scheduled: list[StoreRow], wave_name: str = "wave") -> list[StoreRow]:
    """The batch rows of the scheduled runs once every one of them has ended (a store whose
    run was never created comes back as it is)."""
    ids = [UUID(s.flow_run_id) for s in scheduled if s.flow_run_id]
    with get_client(sync_client=True) as client:
        runs = ended_runs(client, ids) if ids else {}
        return [_row(client, s, runs[UUID(s.flow_run_id)]) if s.flow_run_id else s
                for s in scheduled]
