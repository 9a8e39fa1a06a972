"""A batch without Prefect: its plan (canary first, then fixed-size waves, each region on its
own) and its wave loop (halting a region on its failure ratio). flows/batch_rollout.py wires
them to the tasks that run the stores."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

from store_rollout.batch_rows import StoreRow
from store_rollout.inventory import Store
from store_rollout.regions import Regions, runs_in_region_pools

# what a batch does to each store: roll it out, or update its store server's image (issue 47)
ROLLOUT: Final = "rollout"
UPDATE: Final = "update"
ACTIONS: Final = (ROLLOUT, UPDATE)
# the most stores a batch runs at once as its own subflow runs: each takes a thread of the
# batch's process while it runs (flows/batch_rollout.py sizes its pool by it); a batch of runs
# of their own (windows, regions) waits for them without a thread each, and has no such cap
MAX_IN_FLIGHT: Final = 100


def check_in_flight(max_in_flight: int, per_region: int, *, in_process: bool) -> None:
    """Both bounds at least 1 (per_region 0: as max_in_flight) and, for a batch running its
    stores in its own process (`in_process`), at most MAX_IN_FLIGHT; before any side effect:
    more would leave runs waiting for a thread, not for a slot, and a 0 none at all."""
    top = MAX_IN_FLIGHT if in_process else None
    for field, value, least in (("max_in_flight", max_in_flight, 1),
                                ("max_in_flight_per_region", per_region, 0)):
        if value < least or (top is not None and value > top):
            allowed = f"{least} to {top}" if top is not None else f"at least {least}"
            raise ValueError(f"{field}: {value} is out of range; use {allowed} stores at once"
                             + (" (a batch of subflow runs)" if top is not None else ""))


def plan_waves(store_ids: Sequence[str], canary: int, wave_size: int) -> list[list[str]]:
    """[canary wave, wave, wave, ...]; the canary wave is skipped when canary is 0."""
    if canary < 0 or wave_size < 1:
        raise ValueError("canary must be >= 0 and wave_size >= 1")
    ids = list(store_ids)
    waves = [ids[:canary]] if canary else []
    rest = ids[canary:]
    waves += [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]
    return [w for w in waves if w]


def plan_region_waves(regions: dict[str, str], canary: int,
                      wave_size: int) -> list[dict[str, list[str]]]:
    """Waves per region, run side by side: round k holds each region's wave k ({region:
    stores}). `regions`: store -> its region, in batch order. Each region has its own canary
    and halts on its own failures: one region's broken master does not stop the others."""
    per_region: dict[str, list[str]] = {}
    for store_id, region in regions.items():
        per_region.setdefault(region, []).append(store_id)
    planned = {region: plan_waves(ids, canary, wave_size) for region, ids in per_region.items()}
    rounds = max((len(waves) for waves in planned.values()), default=0)
    return [{region: waves[number] for region, waves in planned.items() if number < len(waves)}
            for number in range(rounds)]


def should_halt(failed: int, finished: int, threshold: float) -> bool:
    """Halt the remaining waves when failed / finished is strictly above the threshold."""
    return finished > 0 and failed / finished > threshold


def regions_to_halt(rows: list[StoreRow], regions: list[str],
                    threshold: float) -> dict[str, tuple[int, int]]:
    """Of `regions`, those whose finished stores failed above `threshold`: region -> (failed,
    finished). A region halts on its own stores' failures only."""
    halting = {}
    for region in regions:
        ended = [row for row in rows if row.region == region]
        # a store that waits for an approval, or that a person rejected, has not failed
        failed = sum(1 for row in ended if row.failed)
        if should_halt(failed, len(ended), threshold):
            halting[region] = (failed, len(ended))
    return halting


def runs_of_their_own(approval_policy: str, ignore_windows: bool, calendars: bool,
                      other_regions: bool = False, action: str = ROLLOUT) -> bool:
    """Whether a batch's stores are runs of the store-rollout deployment instead of subflows of
    the batch: when they wait for their windows (`calendars`, not overridden), may ask for an
    approval before any change (a subflow inside the batch's task can neither pause nor be
    parked) or belong to other regions than the batch's process (`other_regions`: only a
    worker of their region reaches their Salt master). Image updates always are: each a run
    of the store-image-update deployment."""
    return ((calendars and not ignore_windows) or approval_policy == "always" or other_regions
            or action == UPDATE)


@dataclass(frozen=True)
class BatchPlan:
    """What a batch does, decided before any side effect: its stores in batch order
    (`selected`), those it runs (`todo`, the others rolled out before), the regions they are
    in, and how it runs them: as runs of their own (`as_deployment_runs`), in their windows
    (`follow_windows`), in `rounds` of waves."""

    selected: list[str]
    todo: list[str]
    in_regions: list[str]
    follow_windows: bool
    as_deployment_runs: bool
    rounds: list[dict[str, list[str]]]


def check_regions(stores: list[Store], regions: Regions) -> None:
    """Every store's region is one of the chain's (RegionsError naming the store, else)."""
    for store in stores:
        regions.spec(store.region, f"store {store.store_id}: region")


def plan_batch(stores: list[Store], done: Collection[str], regions: Regions, serving: str, *,
               approval_policy: str, ignore_windows: bool, canary: int,
               wave_size: int, action: str = ROLLOUT) -> BatchPlan:
    """The plan of a batch of `stores` served by a process of region `serving`; `done`: the
    stores left as they are (rolled out before); `action`: rollout or update."""
    if action not in ACTIONS:
        raise ValueError(f"action: {action!r} is no batch action; use one of "
                         f"{', '.join(ACTIONS)}")
    todo = [store for store in stores if store.store_id not in done]
    calendars = any(store.calendar for store in stores)
    in_regions = sorted({store.region for store in todo})
    other_regions = runs_in_region_pools(regions, serving, in_regions)
    return BatchPlan(
        selected=[store.store_id for store in stores],
        todo=[store.store_id for store in todo], in_regions=in_regions,
        follow_windows=calendars and not ignore_windows,
        as_deployment_runs=runs_of_their_own(approval_policy, ignore_windows, calendars,
                                             other_regions=other_regions, action=action),
        rounds=plan_region_waves({store.store_id: store.region for store in todo}, canary,
                                 wave_size))


def store_run_params(store_params: dict[str, float], approval_policy: str,
                     ignore_windows: bool, *, run_of_its_own: bool,
                     image_version: str = "") -> dict[str, Any]:
    """The parameters of each store's rollout (or update) in a batch: the step timeouts given,
    the approval policy asked for (if any) and `ignore_windows`; a run of its own takes its
    in-flight slots itself when it starts (`hold_fleet_slot`); an update the image version
    named (none: each store's own)."""
    asked = {"approval_policy": approval_policy} if approval_policy else {}
    slots = {"hold_fleet_slot": True} if run_of_its_own else {}
    version = {"image_version": image_version} if image_version else {}
    return {**store_params, **asked, **slots, **version, "ignore_windows": ignore_windows}


@dataclass(frozen=True)
class WaveDone:
    """A wave has ended: its `number`, how long it took, the batch's rows so far (`finished`
    of `total`, `failed`, `need_a_person`: waiting for an approval or rejected) and the
    regions that halt after it (region -> (failed, finished))."""

    number: int
    seconds: float
    finished: int
    total: int
    failed: int
    need_a_person: int
    halting: dict[str, tuple[int, int]]


def run_waves(rounds: list[dict[str, list[str]]],
              run_wave: Callable[[int, list[str]], list[StoreRow]], threshold: float,
              rows: dict[str, StoreRow], *, total: int,
              on_wave: Callable[[WaveDone], None] = lambda done: None,
              clock: Callable[[], float] = time.monotonic) -> dict[str, StoreRow]:
    """The batch's rows (store -> row, `rows` the stores it had before) once every round has
    run: each round's stores of the regions still going run as one wave (`run_wave(number,
    store_ids)` returns their rows); a region whose failed/finished stores exceed `threshold`
    after a wave halts, its later stores Skipped. `on_wave` hears of each wave's end, `clock`
    times it."""
    rows = dict(rows)
    halted_after: dict[str, int] = {}  # region -> the wave after which it halted
    for number, by_region in enumerate(rounds):
        going = [region for region in by_region if region not in halted_after]
        rows.update({sid: StoreRow.skipped(sid, region, halted_after[region])
                     for region, ids in by_region.items() if region in halted_after
                     for sid in ids})
        wave = [sid for region in going for sid in by_region[region]]
        if not wave:
            continue
        started = clock()
        rows.update({row.store_id: row for row in run_wave(number, wave)})
        halting = regions_to_halt(list(rows.values()), going, threshold)
        halted_after.update(dict.fromkeys(halting, number))
        on_wave(WaveDone(number=number, seconds=clock() - started, finished=len(rows),
                         total=total, failed=sum(1 for row in rows.values() if row.failed),
                         need_a_person=sum(1 for row in rows.values() if row.needs_a_person),
                         halting=halting))
    return rows
