"""Issue 30, batches that follow the stores' clocks: when a store's scheduled run is to start
(tasks/store_runs.py), what a batch refuses before it schedules anything, and how it waits for
its runs. The runs themselves, in the lab: tests/lab/test_windows_lab.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from store_rollout.inventory import parse_inventory
from tasks.flow_runs import DeploymentUnavailable, check_deployment
from tasks.store_runs import ended_runs, start_time

MONDAY_NOON = datetime(2026, 6, 1, 10, tzinfo=UTC)  # 12:00 in Berlin, 19:00 in Tokyo
INSTALL = 2700.0


def store(calendar: dict[str, Any] | None) -> Any:
    entry: dict[str, Any] = {"store_id": "s1", "erp": {"site_code": "S1"},
                             "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01"}}
    if calendar is not None:
        entry["calendar"] = calendar
    return parse_inventory({"stores": [entry]}).get("s1")


def test_a_store_in_its_window_starts_now() -> None:
    start, why = start_time(store({"time_zone": "Asia/Tokyo", "windows": ["daily 18:00-23:00"]}),
                            MONDAY_NOON, INSTALL)
    assert start == MONDAY_NOON and "starts in the maintenance window" in why


def test_a_store_outside_its_window_starts_at_the_next_one_in_its_own_time() -> None:
    start, why = start_time(store({"time_zone": "Europe/Berlin", "windows": ["Mon-Sat 22:00-06:00"]}),
                            MONDAY_NOON, INSTALL)
    assert start == datetime(2026, 6, 1, 20, 0, 1, tzinfo=UTC), why  # 22:00 CEST, and a second
    start, _ = start_time(store({"time_zone": "America/New_York",
                                 "windows": ["Mon-Sat 22:00-06:00"]}), MONDAY_NOON, INSTALL)
    assert start == datetime(2026, 6, 2, 2, 0, 1, tzinfo=UTC)  # 22:00 EDT


def test_a_window_too_short_for_step_2_is_skipped() -> None:
    # Tokyo 19:00; today's window closes in 30 min, step 2 needs 45: tomorrow's
    start, why = start_time(store({"time_zone": "Asia/Tokyo", "windows": ["daily 18:00-19:30"]}),
                            MONDAY_NOON, INSTALL)
    assert start == datetime(2026, 6, 2, 9, 0, 1, tzinfo=UTC), why
    assert "closes in 30 min" in why


def test_a_store_without_a_calendar_follows_the_default_one_or_gets_no_start() -> None:
    from store_rollout.inventory.calendar_spec import CalendarSpec

    start, why = start_time(store(None), MONDAY_NOON, INSTALL)
    assert start is None and "STORE_ROLLOUT_DEFAULT_TIME_ZONE" in why
    always = CalendarSpec(time_zone="UTC", windows=["daily 00:00-24:00"])
    assert start_time(store(None), MONDAY_NOON, INSTALL, always)[0] == MONDAY_NOON


def test_a_store_without_any_window_gets_no_start() -> None:
    start, why = start_time(store({"time_zone": "Europe/Berlin", "windows": ["Mon 22:00-23:00"]}),
                            MONDAY_NOON, INSTALL * 2)
    assert start is None and "no window of 1 h 30 min or more" in why


def test_a_batch_refuses_a_deployment_that_cannot_run_its_stores(prefect_harness: None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with pytest.raises(DeploymentUnavailable) as missing:
        check_deployment("store-rollout/no-such-deployment")
    assert str(missing.value).startswith("store_deployment: Prefect has no deployment "
                                         "'store-rollout/no-such-deployment'")
    assert "prefect deploy --all" in str(missing.value)

    pool = f"pool-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = client.create_flow_from_name("store-rollout")
        client.create_deployment(flow_id=flow_id, name=pool, work_pool_name=pool)
    with pytest.raises(DeploymentUnavailable) as idle:  # no worker ever polled the pool
        check_deployment(f"store-rollout/{pool}")
    assert f"no worker polls work pool '{pool}'" in str(idle.value)
    assert f"`prefect worker start --pool {pool}`" in str(idle.value)
    with get_client(sync_client=True) as client:  # a worker's heartbeat makes the pool ready
        client.send_worker_heartbeat(pool, "worker-1")
    assert check_deployment(f"store-rollout/{pool}") == pool


class Runs:
    """A Prefect client whose runs end one read after another."""

    def __init__(self, ends_after: list[int]) -> None:
        self.reads = 0
        self.ends_after = ends_after
        self.ids = [uuid.uuid4() for _ in ends_after]

    def read_flow_runs(self, flow_run_filter: Any) -> list[Any]:
        self.reads += 1
        return [SimpleNamespace(id=rid, state=SimpleNamespace(is_final=lambda n=n: self.reads > n,
                                                              is_paused=lambda: False))
                for rid, n in zip(self.ids, self.ends_after, strict=True)]


def test_the_batch_waits_until_every_run_of_the_wave_ended() -> None:
    runs, slept = Runs([1, 3]), []
    ended = ended_runs(runs, runs.ids, sleep=slept.append)
    assert set(ended) == set(runs.ids) and runs.reads == 4 and len(slept) == 3


def test_which_batches_make_their_stores_runs_of_their_own() -> None:
    from store_rollout.waves import runs_of_their_own

    assert runs_of_their_own("destructive", ignore_windows=False, calendars=True)
    assert not runs_of_their_own("destructive", ignore_windows=True, calendars=True)
    assert not runs_of_their_own("never", ignore_windows=False, calendars=False)
    # asking before any change: a run of its own (a subflow in the batch's task cannot pause)
    assert runs_of_their_own("always", ignore_windows=True, calendars=False)


def test_a_parked_run_ends_the_wait_and_its_row_says_it_waits_for_an_approval() -> None:
    """Issue 43: a run parked for its approval (Suspended, resumable) never ends by itself:
    the batch counts it as ended, not done, and does not halt on it."""
    from store_rollout.batch_rows import StoreRow
    from store_rollout.waves import regions_to_halt
    from tasks.store_runs import parked

    suspended = SimpleNamespace(is_final=lambda: False, is_paused=lambda: True, name="Suspended")
    paused = SimpleNamespace(is_final=lambda: False, is_paused=lambda: True, name="Paused")
    assert parked(suspended) and not parked(paused)

    class Parked(Runs):
        def read_flow_runs(self, flow_run_filter: Any) -> list[Any]:
            self.reads += 1
            return [SimpleNamespace(id=self.ids[0], state=suspended)]

    runs, slept = Parked([99]), []
    assert set(ended_runs(runs, runs.ids, sleep=slept.append)) == set(runs.ids) and not slept
    rows = [StoreRow(store_id=state, region="default", state=state) for state in
            ("Completed", "AwaitingApproval", "Rejected", "NotApproved")]
    assert regions_to_halt(rows, ["default"], 0.2) == {}
    failed = StoreRow(store_id="f", region="default", state="Failed")
    assert regions_to_halt([*rows, failed], ["default"], 0.1) == {"default": (1, 5)}
