"""Issue 30, the guard on disruptive steps: when a disruptive step may start
(store_rollout/disruption.py), and how a run waits for the window (tasks/windows.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from store_rollout.contracts import STEP_CREATE_VM, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.disruption import DISRUPTIVE_STEPS, decide
from store_rollout.inventory.calendar_spec import CalendarSpec
from tasks.windows import NoMaintenanceWindow, run_in_window, wait_for_window

BERLIN = CalendarSpec(time_zone="Europe/Berlin", windows=["Mon-Sat 22:00-06:00"])
MONDAY_NOON = datetime(2026, 6, 1, 10, tzinfo=UTC)  # 12:00 in Berlin
HOUR = timedelta(hours=1)
STEP = STEP_PXE_INSTALL_HYPERVISOR


def test_the_disruptive_steps_are_step_2_and_step_5() -> None:
    assert set(DISRUPTIVE_STEPS) == {STEP_PXE_INSTALL_HYPERVISOR, STEP_CREATE_VM}


def test_no_calendar_is_no_window_fail_closed() -> None:
    """Issue 43: a store without a calendar, and no default one, is never disrupted "any
    time": refused naming what to set, unless overridden (and then it says so)."""
    decision = decide(STEP, None, MONDAY_NOON, HOUR)
    assert not decision.go and decision.wait_until is None
    assert "STORE_ROLLOUT_DEFAULT_TIME_ZONE" in decision.reason and "--now" in decision.reason
    overridden = decide(STEP, None, MONDAY_NOON, HOUR, ignore_windows=True)
    assert overridden.go and overridden.overridden and "no calendar" in overridden.reason


def test_outside_a_window_the_step_waits_for_the_next_one() -> None:
    decision = decide(STEP, BERLIN, MONDAY_NOON, HOUR)
    assert not decision.go
    assert decision.wait_until == datetime(2026, 6, 1, 20, tzinfo=UTC)  # 22:00 CEST
    assert "outside its maintenance windows" in decision.reason
    assert "waiting for the next window: Mon 2026-06-01 22:00" in decision.reason


def test_inside_a_window_with_time_left_the_step_goes() -> None:
    late = datetime(2026, 6, 1, 21, tzinfo=UTC)  # 23:00, 7 h left
    decision = decide(STEP, BERLIN, late, 2 * HOUR)
    assert decision.go and decision.wait_until is None and "starts in the maintenance window" \
        in decision.reason


def test_a_window_closing_before_the_step_could_finish_is_not_used() -> None:
    near_close = datetime(2026, 6, 2, 3, 30, tzinfo=UTC)  # 05:30 Tuesday, 30 min left
    decision = decide(STEP, BERLIN, near_close, HOUR)
    assert not decision.go
    assert "closes in 30 min" in decision.reason and "takes up to 1 h 00 min" in decision.reason
    assert decision.wait_until == datetime(2026, 6, 2, 20, tzinfo=UTC)


def test_windows_too_short_for_the_step_are_skipped() -> None:
    short_and_long = CalendarSpec(time_zone="UTC", windows=["Mon 01:00-01:30", "Wed 01:00-05:00"])
    decision = decide(STEP, short_and_long, datetime(2026, 6, 1, tzinfo=UTC), HOUR)
    assert decision.wait_until == datetime(2026, 6, 3, 1, tzinfo=UTC)
    never = CalendarSpec(time_zone="UTC", windows=["Mon 01:00-01:30"])
    refused = decide(STEP, never, datetime(2026, 6, 1, tzinfo=UTC), HOUR)
    assert not refused.go and refused.wait_until is None
    assert "no window of 1 h 00 min or more" in refused.reason and "--now" in refused.reason


def test_an_override_goes_and_says_so() -> None:
    decision = decide(STEP, BERLIN, MONDAY_NOON, HOUR, ignore_windows=True)
    assert decision.go and decision.overridden
    assert decision.reason.startswith("window check overridden (ignore_windows): the store is "
                                      "outside its maintenance windows")


def test_a_run_waits_until_the_window_then_runs_the_step_again() -> None:
    opens = datetime.now(UTC) + timedelta(seconds=0.3)
    calls: list[dict[str, Any]] = []

    def step() -> dict[str, Any]:
        go = datetime.now(UTC) >= opens
        calls.append({"at": datetime.now(UTC), "go": go})
        return {"done": go, "window": {"go": go, "reason": "outside", "wait_until": opens}}

    result = run_in_window("s1", step)
    assert result["done"] and [c["go"] for c in calls] == [False, True]
    assert calls[1]["at"] >= opens
    with pytest.raises(NoMaintenanceWindow, match="store s1: no window of 1 h"):
        wait_for_window("s1", {"go": False, "reason": "no window of 1 h", "wait_until": None})
    skipped = run_in_window("s1", lambda: {"skipped": True})  # a step with nothing to disrupt
    assert skipped == {"skipped": True}


@pytest.mark.parametrize("command", [["rollout", "s1"], ["batch"]])
def test_now_is_the_window_override(command: list[str], monkeypatch: pytest.MonkeyPatch,
                                    tmp_path: Any) -> None:
    """`rollout --now` and `batch --now` run the stores with ignore_windows (what `lab demo`
    does too, tests/lab/test_windows_lab.py); without it, the windows hold."""
    from typer.testing import CliRunner

    import app.cli

    asked: list[dict[str, Any]] = []

    def run_stores(store_ids: list[str], inventory: Any, live: bool, **params: Any) -> Any:
        asked.append(params)
        return [{"store_id": "s1", "state": "Completed", "seconds": 1.0}]

    def run_batch(inventory: Any, store_ids: list[str], show_progress: bool, **waves: Any) -> Any:
        asked.append(waves)
        raise SystemExit(0)

    monkeypatch.setattr(app.cli, "validate_stores", lambda *args, **kwargs: None)
    monkeypatch.setattr(app.cli, "run_stores", run_stores)
    monkeypatch.setattr(app.cli, "run_batch", run_batch)
    inventory = ["--inventory", str(tmp_path / "inv.yaml")]
    for extra in ([], ["--now"]):
        CliRunner().invoke(app.cli.app, [*command, *inventory, *extra])
    assert [a["ignore_windows"] for a in asked] == [False, True], asked
