"""Batch planning and the wave loop (pure logic, a fake clock: nothing sleeps); the rows."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from store_rollout.batch_rows import RunTimer, StoreRow
from store_rollout.waves import (
    MAX_IN_FLIGHT,
    WaveDone,
    check_in_flight,
    plan_region_waves,
    plan_waves,
    run_waves,
    should_halt,
)


def test_plan_waves_canary_then_fixed_size() -> None:
    ids = [f"s{i}" for i in range(6)]
    assert plan_waves(ids, canary=1, wave_size=2) == [["s0"], ["s1", "s2"], ["s3", "s4"], ["s5"]]
    assert plan_waves(ids, canary=0, wave_size=4) == [["s0", "s1", "s2", "s3"], ["s4", "s5"]]
    assert plan_waves(ids[:1], canary=3, wave_size=2) == [["s0"]]
    with pytest.raises(ValueError):
        plan_waves(ids, canary=1, wave_size=0)


def test_halt_is_strictly_above_threshold() -> None:
    assert not should_halt(0, 0, 0.0)
    assert should_halt(1, 1, 0.2)  # a failed canary halts
    assert not should_halt(1, 5, 0.2)  # exactly the threshold: go on
    assert should_halt(1, 5, 0.1)


# ------------------------------------------------ the wave loop, on a fake clock (no sleeping)

class FakeClock:
    """Monotonic seconds that move only when a fake store run says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_wave(clock: FakeClock, outcome: dict[str, str], seconds: float = 10.0,
              ) -> tuple[Callable[[int, list[str]], list[StoreRow]], list[list[str]]]:
    """A run_wave whose stores take `seconds` each, one after the other, ending as `outcome`
    says (Completed by default); and the waves it was asked to run."""
    asked: list[list[str]] = []

    def run_wave(_number: int, wave: list[str]) -> list[StoreRow]:
        asked.append(wave)
        clock.now += seconds * len(wave)
        return [StoreRow(store_id=sid, region=sid[0], state=outcome.get(sid, "Completed"),
                         step_reached="notify_erp", seconds=seconds) for sid in wave]

    return run_wave, asked


@pytest.fixture(autouse=True)
def no_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_seconds: float) -> None:
        raise AssertionError("the wave loop slept")

    monkeypatch.setattr(time, "sleep", refuse)


def test_a_region_whose_canary_fails_halts_and_the_others_go_on() -> None:
    clock = FakeClock()
    regions = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "b3": "b"}
    rounds = plan_region_waves(regions, canary=1, wave_size=2)
    run_wave, asked = fake_wave(clock, {"a1": "Failed"})
    heard: list[WaveDone] = []
    rows = run_waves(rounds, run_wave, 0.2, {}, total=6, on_wave=heard.append, clock=clock)
    assert asked == [["a1", "b1"], ["b2", "b3"]]  # a's later wave never ran
    assert rows["a2"] == StoreRow.skipped("a2", "a", 0) == rows["a3"].model_copy(
        update={"store_id": "a2"})
    assert rows["a2"].row() == {"store_id": "a2", "region": "a", "state": "Skipped",
                                "step_reached": "-", "seconds": 0, "queued_seconds": 0,
                                "began": None, "ended": None,
                                "error": "batch halted after wave 0 in region a"}
    assert [r.state for r in (rows["b1"], rows["b2"], rows["b3"])] == ["Completed"] * 3
    # each wave timed on the injected clock: two stores of 10 s each; a skipped store counts
    # with the failed ones (not done, and no person to ask)
    assert [(d.number, d.seconds, d.finished, d.failed, d.halting) for d in heard] == [
        (0, 20.0, 2, 1, {"a": (1, 1)}), (1, 20.0, 6, 3, {})]
    assert clock.now == 1040.0


def test_stores_done_before_count_and_an_approval_is_not_a_failure() -> None:
    clock = FakeClock()
    before = {"a0": StoreRow.rolled_out_before("a0", "a", "run-id", "rollout-a0, ended ...")}
    rounds = plan_region_waves({"a1": "a", "a2": "a", "a3": "a"}, canary=1, wave_size=2)
    run_wave, asked = fake_wave(clock, {"a1": "AwaitingApproval", "a2": "Failed"})
    heard: list[WaveDone] = []
    rows = run_waves(rounds, run_wave, 0.4, before, total=4, on_wave=heard.append, clock=clock)
    assert asked == [["a1"], ["a2", "a3"]]  # waiting for an approval halts nothing
    assert [(d.finished, d.failed, d.need_a_person, d.halting) for d in heard] == [
        (2, 0, 1, {}), (4, 1, 1, {})]  # 1 failed of 4 finished: not above 0.4
    assert set(rows) == {"a0", "a1", "a2", "a3"} and rows["a0"] is before["a0"]


def test_a_batch_with_nothing_to_do_runs_no_wave() -> None:
    run_wave, asked = fake_wave(FakeClock(), {})
    assert run_waves([], run_wave, 0.2, {}, total=0) == {} and asked == []


# ------------------------------------------------ the rows: as the table and the result had them

def test_each_kind_of_row_has_the_columns_it_had() -> None:
    timer = RunTimer(clock=FakeClock(), wall=lambda: 1700000000.12345)
    timer.clock.now += 2.04  # type: ignore[attr-defined]
    timer.slot_taken()
    timer.clock.now += 61.26  # type: ignore[attr-defined]
    timer.run_ended()
    done = StoreRow.ran("s1", "a", state="Completed", rolled_out=True, message="",
                        erp_id="ERP-1", step_reached="notify_erp", timer=timer)
    assert done.row() == {"store_id": "s1", "region": "a", "state": "Completed",
                          "step_reached": "notify_erp", "seconds": 61.3, "queued_seconds": 2.0,
                          "error": "", "began": 1700000000.123, "ended": 1700000000.123,
                          "erp_id": "ERP-1"}
    failed = StoreRow.ran("s1", "a", state="Failed", rolled_out=False, message="x" * 400,
                          erp_id=None, step_reached="validation", timer=timer)
    assert set(failed.row()) == set(done.row()) - {"erp_id"} and failed.error == "x" * 300
    before = StoreRow.rolled_out_before("s2", "a", "id-2", "rollout-s2, ended 2025-01-01 00:00 UTC")
    assert before.row() == {"store_id": "s2", "state": "Completed", "step_reached": "-",
                            "seconds": 0, "queued_seconds": 0, "began": None, "ended": None,
                            "flow_run_id": "id-2", "error": "",
                            "earlier_run": "rollout-s2, ended 2025-01-01 00:00 UTC",
                            "region": "a"}
    no_window = StoreRow(store_id="s3", region="a", window="no window", flow_run_id=None,
                         scheduled_start=None, state="Failed", began=None, ended=None,
                         error="NoMaintenanceWindow: no window")
    assert no_window.row() == {"store_id": "s3", "region": "a", "window": "no window",
                               "flow_run_id": None, "scheduled_start": None, "state": "Failed",
                               "step_reached": "-", "seconds": 0, "queued_seconds": 0,
                               "began": None, "ended": None,
                               "error": "NoMaintenanceWindow: no window"}
    assert json.dumps(no_window.row()["seconds"]) == "0"  # an int stays an int in the JSON


@pytest.mark.parametrize(("fleet", "per_region", "field"), [
    (0, 0, "max_in_flight"), (101, 0, "max_in_flight"), (50, 101, "max_in_flight_per_region"),
    (50, -1, "max_in_flight_per_region")])
def test_in_flight_bounds_out_of_range_name_the_field(fleet: int, per_region: int,
                                                     field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: .* use (\d to 100|at least \d) stores"):
        check_in_flight(fleet, per_region, in_process=True)


def test_runs_of_their_own_take_no_thread_and_have_no_cap() -> None:
    """A chain's batch of deployment runs (windows, regions) may bound its stores above 100
    (review: the cap held a 10-region chain to 100 in flight)."""
    check_in_flight(500, 50, in_process=False)
    with pytest.raises(ValueError, match="^max_in_flight: 0 .* at least 1"):
        check_in_flight(0, 0, in_process=False)


def test_the_batch_has_a_thread_for_every_store_it_may_run_at_once() -> None:
    """A smaller pool than MAX_IN_FLIGHT caps a batch's stores in flight below its limit."""
    from flows.batch_rollout import STORE_THREADS

    check_in_flight(MAX_IN_FLIGHT, MAX_IN_FLIGHT, in_process=True)  # the largest is allowed
    assert STORE_THREADS._max_workers >= MAX_IN_FLIGHT
