"""A batch of stores in waves: canary first, bounded stores in flight, halt on failures, each
region on its own.

Wiring only: each store is the `store-rollout` flow. When the stores have calendars, each
store's run is a run of the `store-rollout` deployment Scheduled for its store's next
maintenance window (tasks/store_runs.py); when they span regions, each is a run of its
region's copy of that deployment, in the region's work pool; otherwise, or with
`ignore_windows`, a subflow run started at once.
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
from store_rollout.approval_policy import NOT_FAILED, UNAPPROVED_ENDS, tightened
from store_rollout.inventory import load_inventory
from store_rollout.regions import regional_deployment, regional_limit, runs_in_region_pools
from store_rollout.settings import load_settings
from store_rollout.settings_parts import CalendarSettings
from store_rollout.waves import plan_region_waves, regions_to_halt, runs_of_their_own
from tasks.flow_runs import check_deployment
from tasks.run_health import beating
from tasks.slots import IN_FLIGHT_LIMIT, fleet_slot, in_flight_slots, set_limit
from tasks.store_runs import (
    STORE_DEPLOYMENT,
    rolled_out_stores,
    schedule_store_run,
    wait_for_store_runs,
)

# threads are cheap waiters; the real bound is the IN_FLIGHT_LIMIT concurrency limit
STORE_THREADS: Any = ThreadPoolTaskRunner(max_workers=32)


@task(name="rollout_store", task_run_name="store-{store_id}")
def rollout_store(store_id: str, inventory: str, params: dict[str, Any],
                  region: str) -> dict[str, Any]:
    """One store as a subflow run, holding a chain-wide and a regional in-flight slot; never
    raises."""
    reached: dict[str, str] = {}

    def listen(sid: str, step: str, state: str, _s: float) -> None:
        if sid == store_id:
            reached["step"] = step

    steps.add_listener(listen)
    started = time.monotonic()
    try:
        with fleet_slot(in_flight_slots(region)):
            waited = time.monotonic() - started
            began = time.time()
            state = store_rollout(store_id, inventory, return_state=True, **params)
            ended = time.time()
    finally:
        steps.remove_listener(listen)
    row: dict[str, Any] = {"store_id": store_id, "region": region, "state": state.name,
                           "step_reached": reached.get("step", "validation"),
                           "seconds": round(time.monotonic() - started - waited, 1),
                           "queued_seconds": round(waited, 1), "error": "",
                           "began": round(began, 3), "ended": round(ended, 3)}
    if state.is_completed() and state.name not in UNAPPROVED_ENDS:
        result: Any = state.result()
        row.update(state="Completed", erp_id=result["erp_id"])
    else:
        row["error"] = str(state.message or "")[:300]
    return row


@flow(name="batch-rollout", flow_run_name="batch-{wave_size}x-{canary}c",
      task_runner=STORE_THREADS)
@beating
def batch_rollout(inventory: str, store_ids: tuple[str, ...] = (),
                  canary: int = 1, wave_size: int = 5, max_in_flight: int = 3,
                  halt_failure_ratio: float = 0.2,
                  # never mutated; a dict default (not None) is a plain JSON field in the UI form
                  store_params: dict[str, float] = {},  # noqa: B006
                  ignore_windows: bool = False,
                  store_deployment: str = STORE_DEPLOYMENT,
                  approval_policy: str = "", max_in_flight_per_region: int = 0,
                  rerun_completed: bool = False) -> list[dict[str, Any]]:
    """Per region, a canary wave, then waves of `wave_size`, the regions side by side; at most
    `max_in_flight` stores at once (chain-wide) and `max_in_flight_per_region` in a region; a
    region's remaining waves are skipped once its failed/finished > halt_failure_ratio. Stores
    whose newest rollout run Completed are left as they are (unless `rerun_completed`).

    Args:
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        store_ids: Only these stores of the inventory, in this order (empty: every store).
        canary: Stores in a region's first wave, which runs before any other store of the
            region starts.
        wave_size: Stores per wave after the canary wave.
        max_in_flight: Stores rolled out at once, fleet-wide (a Prefect global concurrency limit).
        halt_failure_ratio: Skip a region's remaining waves once its failed/finished stores
            exceed this ratio (0.2: more than one store in five failed).
        store_params: Step timeouts passed to every store's rollout, e.g.
            {"hypervisor_timeout": 3600}.
        ignore_windows: Emergency: every store starts now and its disruptive steps start
            outside its maintenance windows (each run says so). Without it, stores with a
            calendar are scheduled into their windows.
        store_deployment: The deployment whose runs roll the stores out when they are
            scheduled into their windows or belong to another region than the batch's worker
            (a store of region r: its copy `<store_deployment>-r` in r's work pool; a worker
            of each pool must be running).
        approval_policy: When each store's run asks for an approval on its page first: never,
            destructive or always; empty: the approval_policy setting (only a stricter one is
            taken: a weaker one fails the batch before it starts anything). Under "always" every
            store is a run of `store_deployment` (a paused run must be a run of its own).
        max_in_flight_per_region: Stores rolled out at once in each region (its Salt master
            and Cobbler); 0: as max_in_flight.
        rerun_completed: Roll out again the stores whose newest rollout run Completed; without
            it they are left as they are (a rerun of a batch goes on with the rest).
    """
    logger = get_run_logger()
    settings = load_settings()
    policy = tightened(settings.approval_policy, approval_policy)
    stores = {s.store_id: s for s in load_inventory(inventory).select(list(store_ids))}
    regions = settings.regions()
    for store in stores.values():  # before any side effect: every store's region is known
        regions.spec(store.region, f"store {store.store_id}: region")
    selected = list(stores)
    rows: dict[str, dict[str, Any]] = {} if rerun_completed else {
        sid: {**row, "region": stores[sid].region}
        for sid, row in rolled_out_stores(selected).items()}
    todo = [sid for sid in selected if sid not in rows]
    calendars = any(s.calendar for s in stores.values())
    follow_windows = calendars and not ignore_windows
    in_regions = sorted({stores[sid].region for sid in todo})
    as_deployment_runs = runs_of_their_own(
        policy, ignore_windows, calendars,
        other_regions=runs_in_region_pools(regions, settings.region, in_regions))
    if as_deployment_runs:  # before any side effect: each region's deployment has a worker
        for region in in_regions:
            check_deployment(regional_deployment(store_deployment, region))
    rounds = plan_region_waves({sid: stores[sid].region for sid in todo}, canary, wave_size)
    set_limit(IN_FLIGHT_LIMIT, max_in_flight)
    for region in in_regions:
        set_limit(regional_limit(IN_FLIGHT_LIMIT, region), max_in_flight_per_region or max_in_flight)
    progress_id: Any = create_progress_artifact(progress=100.0 * len(rows) / max(len(selected), 1),
                                                key="batch-progress",
                                                description=f"{len(selected)} stores")
    halted_after: dict[str, int] = {}  # region -> the wave after which it halted
    asked = {"approval_policy": approval_policy} if approval_policy else {}
    for number, by_region in enumerate(rounds):
        wave = []
        for region, ids in by_region.items():
            if region not in halted_after:
                wave += ids
                continue
            for sid in ids:
                rows[sid] = {"store_id": sid, "region": region, "state": "Skipped",
                             "step_reached": "-", "seconds": 0, "queued_seconds": 0,
                             "began": None, "ended": None,
                             "error": f"batch halted after wave {halted_after[region]} in "
                                      f"region {region}"}
        if not wave:
            continue
        if as_deployment_runs:  # each run takes its in-flight slots itself when it starts
            entries = [schedule_store_run(stores[sid], inventory,
                                          {**store_params, **asked, "hold_fleet_slot": True,
                                           "ignore_windows": ignore_windows},
                                          CalendarSettings.of(settings),
                                          regional_deployment(store_deployment,
                                                              stores[sid].region),
                                          follow_windows) for sid in wave]
            finished = wait_for_store_runs(entries, wave_name=f"wave-{number}")
        else:
            params = {**store_params, **asked, "ignore_windows": ignore_windows}
            futures = [rollout_store.submit(sid, inventory, params, stores[sid].region)
                       for sid in wave]
            finished = [future.result() for future in futures]
        for row in finished:
            rows[row["store_id"]] = row
        update_progress_artifact(artifact_id=progress_id, progress=100.0 * len(rows) / len(selected))
        logger.info("wave %d done: %d/%d finished, %d failed, %d need a person (approval)",
                    number, len(rows), len(selected),
                    sum(1 for r in rows.values() if r["state"] not in NOT_FAILED),
                    sum(1 for r in rows.values() if r["state"] in NOT_FAILED - {"Completed"}))
        going = [region for region in by_region if region not in halted_after]
        for region, (failed, ended) in regions_to_halt(list(rows.values()), going,
                                                       halt_failure_ratio).items():
            halted_after[region] = number
            logger.warning("halting region %s: failure ratio %d/%d > %.2f", region, failed,
                           ended, halt_failure_ratio)
    update_progress_artifact(artifact_id=progress_id, progress=100.0)
    table = [rows[sid] for sid in selected]
    create_table_artifact(key="batch-stores", table=table,
                          description=f"batch of {len(selected)} stores")
    return table
