"""A batch of stores in waves: canary first, bounded stores in flight, halt on failures.

Wiring only: each store is the `store-rollout` flow. When the stores have calendars, each
store's run is a run of the `store-rollout` deployment Scheduled for its store's next
maintenance window (tasks/store_runs.py); otherwise, or with `ignore_windows`, a subflow run
started at once.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.task_runners import ThreadPoolTaskRunner

from flows.rollout import store_rollout
from store_rollout import steps
from store_rollout.approvals import REJECTED, check_policy
from store_rollout.inventory import DEFAULT_INVENTORY, load_inventory
from store_rollout.settings import load_settings
from store_rollout.waves import plan_waves, runs_of_their_own, should_halt
from tasks.run_health import beating
from tasks.slots import IN_FLIGHT_LIMIT, fleet_slot, set_limit
from tasks.store_runs import STORE_DEPLOYMENT, check_deployment, schedule_store_run, wait_for_store_runs

# threads are cheap waiters; the real bound is the IN_FLIGHT_LIMIT concurrency limit
STORE_THREADS: Any = ThreadPoolTaskRunner(max_workers=32)


@task(name="rollout_store", task_run_name="store-{store_id}")
def rollout_store(store_id: str, inventory: str, params: dict[str, Any]) -> dict[str, Any]:
    """One store as a subflow run, holding a fleet-wide in-flight slot; never raises."""
    reached: dict[str, str] = {}

    def listen(sid: str, step: str, state: str, _s: float) -> None:
        if sid == store_id:
            reached["step"] = step

    steps.add_listener(listen)
    started = time.monotonic()
    try:
        with fleet_slot(IN_FLIGHT_LIMIT):
            waited = time.monotonic() - started
            began = time.time()
            state = store_rollout(store_id, inventory, return_state=True, **params)
            ended = time.time()
    finally:
        steps.remove_listener(listen)
    row: dict[str, Any] = {"store_id": store_id, "state": state.name,
                           "step_reached": reached.get("step", "validation"),
                           "seconds": round(time.monotonic() - started - waited, 1),
                           "queued_seconds": round(waited, 1), "error": "",
                           "began": round(began, 3), "ended": round(ended, 3)}
    if state.is_completed() and state.name != REJECTED:
        result: Any = state.result()
        row.update(state="Completed", erp_id=result["erp_id"])
    else:
        row["error"] = str(state.message or "")[:300]
    return row


@flow(name="batch-rollout", flow_run_name="batch-{wave_size}x-{canary}c",
      task_runner=STORE_THREADS)
@beating
def batch_rollout(inventory: str = DEFAULT_INVENTORY, store_ids: tuple[str, ...] = (),
                  canary: int = 1, wave_size: int = 5, max_in_flight: int = 3,
                  halt_failure_ratio: float = 0.2,
                  # never mutated; a dict default (not None) is a plain JSON field in the UI form
                  store_params: dict[str, float] = {},  # noqa: B006
                  ignore_windows: bool = False,
                  store_deployment: str = STORE_DEPLOYMENT,
                  approval_policy: str = "") -> list[dict[str, Any]]:
    """Canary wave, then waves of `wave_size`; at most `max_in_flight` stores at once
    (fleet-wide); the remaining waves are skipped once failed/finished > halt_failure_ratio.

    Args:
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        store_ids: Only these stores of the inventory, in this order (empty: every store).
        canary: Stores in the first wave, which runs alone before any other store starts.
        wave_size: Stores per wave after the canary wave.
        max_in_flight: Stores rolled out at once, fleet-wide (a Prefect global concurrency limit).
        halt_failure_ratio: Skip the remaining waves once failed/finished stores exceed this
            ratio (0.2: more than one store in five failed).
        store_params: Step timeouts passed to every store's rollout, e.g.
            {"hypervisor_timeout": 3600}.
        ignore_windows: Emergency: every store starts now and its disruptive steps start
            outside its maintenance windows (each run says so). Without it, stores with a
            calendar are scheduled into their windows.
        store_deployment: The deployment whose runs roll the stores out when they are
            scheduled into their windows (a worker of its pool must be running).
        approval_policy: When each store's run asks for an approval on its page first: never,
            destructive or always; empty: the approval_policy setting. Under "always" every
            store is a run of `store_deployment` (a paused run must be a run of its own).
    """
    logger = get_run_logger()
    policy = check_policy(approval_policy or load_settings().approval_policy)
    stores = {s.store_id: s for s in load_inventory(inventory).select(list(store_ids))}
    selected = list(stores)
    calendars = any(s.calendar for s in stores.values())
    follow_windows = calendars and not ignore_windows
    as_deployment_runs = runs_of_their_own(policy, ignore_windows, calendars)
    if as_deployment_runs:  # before any side effect: a deployment that a worker runs
        check_deployment(store_deployment)
    waves = plan_waves(selected, canary, wave_size)
    set_limit(IN_FLIGHT_LIMIT, max_in_flight)
    progress_id: Any = create_progress_artifact(progress=0.0, key="batch-progress",
                                                description=f"{len(selected)} stores")
    rows: dict[str, dict[str, Any]] = {}
    halted_after: int | None = None
    for number, wave in enumerate(waves):
        if halted_after is not None:
            for sid in wave:
                rows[sid] = {"store_id": sid, "state": "Skipped", "step_reached": "-",
                             "seconds": 0, "queued_seconds": 0, "began": None, "ended": None,
                             "error": f"batch halted after wave {halted_after}"}
            continue
        asked = {"approval_policy": approval_policy} if approval_policy else {}
        if as_deployment_runs:  # each run takes its in-flight slot itself when it starts
            entries = [schedule_store_run(stores[sid], inventory,
                                          {**store_params, **asked, "hold_fleet_slot": True,
                                           "ignore_windows": ignore_windows},
                                          store_deployment, follow_windows) for sid in wave]
            finished = wait_for_store_runs(entries, wave_name=f"wave-{number}")
        else:
            params = {**store_params, **asked, "ignore_windows": ignore_windows}
            futures = [rollout_store.submit(sid, inventory, params) for sid in wave]
            finished = [future.result() for future in futures]
        for row in finished:
            rows[row["store_id"]] = row
        update_progress_artifact(artifact_id=progress_id, progress=100.0 * len(rows) / len(selected))
        failed = sum(1 for r in rows.values() if r["state"] != "Completed")
        logger.info("wave %d done: %d/%d finished, %d failed", number, len(rows), len(selected),
                    failed)
        if should_halt(failed, len(rows), halt_failure_ratio):
            halted_after = number
            logger.warning("halting: failure ratio %d/%d > %.2f", failed, len(rows),
                           halt_failure_ratio)
    update_progress_artifact(artifact_id=progress_id, progress=100.0)
    table = [rows[sid] for sid in selected]
    create_table_artifact(key="batch-stores", table=table,
                          description=f"batch of {len(selected)} stores")
    return table
