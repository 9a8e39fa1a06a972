"""A batch of stores in waves: canary first, bounded stores in flight, halt on failures, each
region on its own.

Wiring only: each store is the `store-rollout` flow. When the stores have calendars, each
store's run is a run of the `store-rollout` deployment Scheduled for its store's next
maintenance window (tasks/store_runs.py); when they span regions, each is a run of its
region's copy of that deployment, in the region's work pool; otherwise, or with
`ignore_windows`, a subflow run started at once. A batch of image updates (`action`
"update", issue 47) makes each store a run of the `store-image-update` deployment (its
region's copy), in its window, under the same waves, canary and halt: a reverted update ends
Failed and counts as failed.
"""

from __future__ import annotations

from functools import partial
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
from store_rollout.approval_policy import UNAPPROVED_ENDS, tightened
from store_rollout.batch_rows import RunTimer, StoreRow
from store_rollout.image_versions import known
from store_rollout.inventory import Store, load_inventory
from store_rollout.regions import regional_deployment
from store_rollout.settings import load_settings
from store_rollout.settings_parts import CalendarSettings
from store_rollout.waves import (
    MAX_IN_FLIGHT,
    ROLLOUT,
    UPDATE,
    BatchPlan,
    WaveDone,
    check_in_flight,
    check_regions,
    plan_batch,
    run_waves,
    store_run_params,
)
from tasks.flow_runs import check_deployment
from tasks.run_health import beating
from tasks.slots import fleet_slot, in_flight_slots, set_in_flight_limits
from tasks.store_runs import (
    STORE_DEPLOYMENT,
    UPDATE_DEPLOYMENT,
    rolled_out_stores,
    schedule_store_run,
    wait_for_store_runs,
)

# threads are cheap waiters; the real bound is the IN_FLIGHT_LIMIT concurrency limit, which a
# smaller pool would cap below max_in_flight (a pool of 32 held a batch of
# max_in_flight 50 to 32 stores at once)
STORE_THREADS: Any = ThreadPoolTaskRunner(max_workers=MAX_IN_FLIGHT)


@task(name="rollout_store", task_run_name="store-{store_id}")
def rollout_store(store_id: str, inventory: str, params: dict[str, Any],
                  region: str) -> StoreRow:
    """One store as a subflow run, holding a chain-wide and a regional in-flight slot; never
    raises."""
    reached = steps.LastStep(store_id)
    timer = RunTimer()
    with steps.listening(reached), fleet_slot(in_flight_slots(region)):
        timer.slot_taken()
        state = store_rollout(store_id, inventory, return_state=True, **params)
        timer.run_ended()
    rolled_out = state.is_completed() and state.name not in UNAPPROVED_ENDS
    result: Any = state.result() if rolled_out else None
    return StoreRow.ran(store_id, region, state=str(state.name), rolled_out=rolled_out,
                        message=str(state.message or ""),
                        erp_id=result["erp_id"] if rolled_out else None,
                        step_reached=reached.step, timer=timer)


def run_wave(number: int, wave: list[str], *, plan: BatchPlan, stores: dict[str, Store],
             inventory: str, params: dict[str, Any], store_deployment: str,
             calendar: CalendarSettings, action: str = ROLLOUT) -> list[StoreRow]:
    """One wave's stores, each a run of its own (of its region's copy of `store_deployment`)
    or the batch's subflow run; their rows once every one has ended."""
    if plan.as_deployment_runs:  # each run takes its in-flight slots itself when it starts
        scheduled = [schedule_store_run(stores[sid], inventory, params, calendar,
                                        regional_deployment(store_deployment, stores[sid].region),
                                        plan.follow_windows, action) for sid in wave]
        return wait_for_store_runs(scheduled, wave_name=f"wave-{number}")
    futures = [rollout_store.submit(sid, inventory, params, stores[sid].region) for sid in wave]
    return [future.result() for future in futures]


def wave_done(done: WaveDone, *, progress_id: Any, threshold: float) -> None:
    """A wave's end in the batch's progress artifact and its log."""
    update_progress_artifact(artifact_id=progress_id, progress=100.0 * done.finished / done.total)
    logger = get_run_logger()
    logger.info("wave %d done in %.0f s: %d/%d finished, %d failed, %d need a person "
                "(approval)", done.number, done.seconds, done.finished, done.total, done.failed,
                done.need_a_person)
    for region, (failed, ended) in done.halting.items():
        logger.warning("halting region %s: failure ratio %d/%d > %.2f", region, failed, ended,
                       threshold)


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
                  rerun_completed: bool = False, action: str = ROLLOUT,
                  image_version: str = "") -> list[dict[str, Any]]:
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
        max_in_flight: Stores rolled out at once, fleet-wide (a Prefect global concurrency
            limit); at most 100 when the stores run as this batch's subflow runs.
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
        action: "rollout", or "update": each store's store server updated to a new image
            version, each store a run of the store-image-update deployment (its region's copy)
            in its window; a store already on it ends Completed at once, a reverted one Failed.
        image_version: The version an update batch moves every store to (settings
            image_versions); empty: each store's own (its vm.image_version, else the chain's).
    """
    settings = load_settings()
    policy = tightened(settings.approval_policy, approval_policy)
    stores = load_inventory(inventory).select(list(store_ids))
    regions = settings.regions()
    check_regions(stores, regions)  # before any side effect: every store's region is known
    deployment = batch_deployment(action, image_version, store_deployment, settings)
    done = {} if rerun_completed or action == UPDATE else rolled_out_stores(stores)
    plan = plan_batch(stores, done, regions, settings.region, approval_policy=policy,
                      ignore_windows=ignore_windows, canary=canary, wave_size=wave_size,
                      action=action)
    check_in_flight(max_in_flight, max_in_flight_per_region,
                    in_process=not plan.as_deployment_runs)
    if plan.as_deployment_runs:  # before any side effect: each region's deployment has a worker
        for region in plan.in_regions:
            check_deployment(regional_deployment(deployment, region))
    set_in_flight_limits(plan.in_regions, max_in_flight, max_in_flight_per_region)
    total = len(plan.selected)
    progress_id: Any = create_progress_artifact(progress=100.0 * len(done) / max(total, 1),
                                                key="batch-progress", description=f"{total} stores")
    params = store_run_params(store_params, approval_policy, ignore_windows,
                              run_of_its_own=plan.as_deployment_runs, image_version=image_version)
    rows = run_waves(plan.rounds, partial(
        run_wave, plan=plan, stores={s.store_id: s for s in stores}, inventory=inventory,
        params=params, store_deployment=deployment, action=action,
        calendar=CalendarSettings.of(settings)), halt_failure_ratio, done, total=total,
        on_wave=partial(wave_done, progress_id=progress_id, threshold=halt_failure_ratio))
    update_progress_artifact(artifact_id=progress_id, progress=100.0)
    table = [rows[sid].row() for sid in plan.selected]
    create_table_artifact(key="batch-stores", table=table,
                          description=f"batch of {total} stores"
                          + (f", image update to {image_version or 'their versions'}"
                             if action == UPDATE else ""))
    return table


def batch_deployment(action: str, image_version: str, store_deployment: str,
                     settings: Any) -> str:
    """The deployment whose runs carry the batch's stores: `store_deployment` for a rollout,
    store-image-update for an update (its `image_version` checked here, before any side
    effect: a listed version, or empty for each store's own)."""
    if action == UPDATE:
        known(settings, image_version, "image_version")
        return UPDATE_DEPLOYMENT
    if image_version:
        raise ValueError("image_version: only an update batch (action update) takes it; a "
                         "rollout builds each store's own version (vm.image_version, else the "
                         "chain's image_version)")
    return store_deployment
