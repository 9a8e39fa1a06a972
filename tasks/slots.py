"""Fleet-wide slots: Prefect global concurrency limits, held with a lease.

A slot is taken with a lease the holder renews while it runs (`lease_duration`); when the
holder's process dies (kill -9, a lost worker machine) nobody renews it, and the Prefect
server's repossessor frees the slot once the lease expired. The bound for the other stores is
therefore `LEASE_SECONDS` plus the repossessor's loop (15 s) plus a waiting client's retry
interval (at most 30 s): about 105 s (docs/reliability.md). The server must keep its leases
where a restart does not lose them (`PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE`; the default
keeps them in memory, and a restarted server then holds the slots forever).

Acquisition is strict: a missing limit is an error, never a silent pass (which would let
every Cobbler sync of the fleet overlap); preflight checks the limits before any side effect.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from store_rollout.regions import DEFAULT_COBBLER_SYNC_LIMIT, regional_limit
from tasks.run_health import HEARTBEAT_EVENT

COBBLER_SYNC_LIMIT = DEFAULT_COBBLER_SYNC_LIMIT  # the default region's Cobbler (settings.cobbler_sync_limit)
IN_FLIGHT_LIMIT = "stores-in-flight"  # stores rolled out at once, fleet-wide (batch-rollout)
# Prefect's minimum: the shortest time a dead holder keeps a slot
LEASE_SECONDS = 60
# what a dead holder's slot costs the others at most: lease, repossessor loop, client retry
DEAD_HOLDER_SECONDS = LEASE_SECONDS + 15 + 30
# how often a run waiting for its store looks again whether the owner lives
OWNER_POLL_SECONDS = 5
FILESYSTEM_LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"


def limit_problem(name: str, limit: int) -> str | None:
    """What is wrong with the global concurrency limit `name` on the Prefect server, if anything."""
    fix = f"create it: `prefect global-concurrency-limit create {name} --limit {limit}`"
    with get_client(sync_client=True) as client:
        try:
            found = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return f"Prefect has no global concurrency limit {name!r} (it serialises the fleet); {fix}"
    if not found.active:
        return (f"Prefect's global concurrency limit {name!r} is inactive, so nothing is "
                f"serialised; `prefect global-concurrency-limit enable {name}`")
    return None


def set_limit(name: str, limit: int, *, update: bool = True) -> None:
    """Create the global concurrency limit `name` with `limit` slots, active; an existing one is
    set to `limit` and activated, or left as it is with update=False."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):  # another run made it in between
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit, active=True))
            return
        if update:
            client.update_global_concurrency_limit(
                name, GlobalConcurrencyLimitUpdate(limit=limit, active=True))


def set_in_flight_limits(regions: list[str], fleet: int, per_region: int = 0) -> None:
    """A batch's bounds: `fleet` stores in flight chain-wide and `per_region` (0: as many as
    `fleet`) in each of `regions` (its Salt master and Cobbler)."""
    set_limit(IN_FLIGHT_LIMIT, fleet)
    for region in regions:
        set_limit(regional_limit(IN_FLIGHT_LIMIT, region), per_region or fleet)


@contextmanager
def fleet_slot(name: str | list[str], timeout_seconds: float | None = None) -> Iterator[None]:
    """Hold one slot of the global limit `name` (of each limit named, taken together) under a
    renewed lease; a dead holder's slot comes back within about LEASE_SECONDS + 45 s."""
    with concurrency(name, occupy=1, timeout_seconds=timeout_seconds, strict=True,
                     lease_duration=LEASE_SECONDS):
        yield


class StoreBusy(RuntimeError):
    """Another rollout or rollback of the store is running: one owner per store."""


def in_flight_slots(region: str) -> list[str]:
    """What a batch's store run holds while it runs: a slot of the chain's stores in flight
    and one of its region's, taken together (a run waiting for one holds neither)."""
    return [IN_FLIGHT_LIMIT, regional_limit(IN_FLIGHT_LIMIT, region)]


def store_limit(store_id: str) -> str:
    """The store's own limit (1 slot), held by its rollout or rollback for the whole run."""
    return f"store-{store_id}"


def _unfinished_runs(store_id: str, this_run: UUID | None) -> list[Any]:
    """The store's rollout, rollback, image update and revert runs Prefect shows as not
    finished, this one aside."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    names = [f"{kind}-{store_id}" for kind in ("rollout", "rollback", "update", "revert")]
    unfinished = [StateType.PENDING, StateType.RUNNING, StateType.CANCELLING, StateType.PAUSED]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=names),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=unfinished))))
    return [run for run in runs if run.id != this_run]


def _beat_since(runs: list[Any], since: datetime) -> bool:
    """Did any of these flow runs send a heartbeat since `since` (its process lives)?"""
    from prefect.events.filters import (
        EventFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventResourceFilter,
    )

    with get_client(sync_client=True) as client:
        page = client.read_events(filter=EventFilter(
            occurred=EventOccurredFilter.model_validate(
                {"since": since, "until": datetime.now(UTC) + timedelta(minutes=1)}),
            event=EventNameFilter(name=[HEARTBEAT_EVENT]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{run.id}" for run in runs])),
            limit=1)
    return bool(page.events)


def busy_message(store_id: str, owners: list[Any], waited: float) -> str:
    named = ", ".join(f"{run.name!r} (id {run.id}, {run.state.name if run.state else 'no state'} "
                      f"since {run.start_time or run.expected_start_time})" for run in owners)
    holder = (f"flow run {named}" if owners else
              "a run that no longer shows as running (its process died)")
    return (f"store {store_id} is being rolled out or rolled back by {holder}; this run waited "
            f"{waited:.0f} s and changed nothing. Wait for that run to finish or cancel it, then "
            f"run again; a run whose process died frees the store within about "
            f"{DEAD_HOLDER_SECONDS} s")


@contextmanager
def store_owner(store_id: str, wait_seconds: float, this_run: UUID | None = None) -> Iterator[None]:
    """Own the store for the block: a second rollout or rollback of it (UI, API, batch, CLI)
    waits up to `wait_seconds`; if the owner is alive (it sends heartbeats) it then fails with
    StoreBusy naming the owning run. A dead owner (a rerun right after a crash: Prefect still
    shows it Running, but it beats no more) is waited out: its slot comes back within
    DEAD_HOLDER_SECONDS."""
    name = store_limit(store_id)
    set_limit(name, 1, update=False)
    since = datetime.now(UTC)
    started = time.monotonic()
    with ExitStack() as stack:

        def take(timeout: float) -> bool:
            try:
                stack.enter_context(fleet_slot(name, timeout_seconds=timeout))
                return True
            except TimeoutError:
                return False

        if not take(wait_seconds):
            while True:
                owners = _unfinished_runs(store_id, this_run)
                waited = time.monotonic() - started
                if (owners and _beat_since(owners, since)) or \
                        waited > wait_seconds + DEAD_HOLDER_SECONDS:
                    raise StoreBusy(busy_message(store_id, owners, waited))
                if take(OWNER_POLL_SECONDS):
                    break
        yield


class ReleasableSlot:
    """Fleet slots a run holds while it works and gives back while it only waits (for its
    store's maintenance window): a waiting run starves no other store of the fleet."""

    def __init__(self, names: str | list[str]) -> None:
        self.names = names
        self._held: ExitStack | None = None

    def take(self) -> None:
        if self._held is None:
            stack = ExitStack()
            stack.enter_context(fleet_slot(self.names))
            self._held = stack

    def give_back(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held.close()

    def __enter__(self) -> ReleasableSlot:
        self.take()
        return self

    def __exit__(self, *_: object) -> None:
        self.give_back()
