"""The flows' own heartbeats and the automation that takes a silent run for dead
(tasks/run_health.py); the lab tests kill real runs (test_plan_reconcile, test_faults)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from store_rollout.settings import SettingsError
from store_rollout.settings_outside import one_setting
from tasks import run_health
from tasks.run_health import HEARTBEAT_EVENT, heartbeats, zombie_after, zombie_automation


class Beats:
    """A fake `emit_event`: records each beat; fails the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[dict[str, Any]] = []
        self.failures = failures

    def __call__(self, **event: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("events websocket closed")
        self.sent.append(event)


def beat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("heartbeats-")]


@pytest.fixture
def in_a_run(monkeypatch: pytest.MonkeyPatch) -> str:
    run_id = uuid4()
    monkeypatch.setattr(run_health, "this_flow_run", lambda: run_id)
    return str(run_id)


def test_a_run_beats_at_once_then_every_interval_and_stops_when_it_ends(in_a_run: str) -> None:
    beats = Beats()
    with heartbeats(0.05, emit=beats):
        time.sleep(0.32)
    assert not beat_threads()  # stopped with the block, not after the interval
    count = len(beats.sent)
    assert 5 <= count <= 8, beats.sent
    assert {b["event"] for b in beats.sent} == {HEARTBEAT_EVENT}
    assert {b["resource"]["prefect.resource.id"] for b in beats.sent} == {
        f"prefect.flow-run.{in_a_run}"}
    time.sleep(0.15)
    assert len(beats.sent) == count


def test_a_long_interval_does_not_hold_up_the_end_of_the_run(in_a_run: str) -> None:
    """Prefect's own loop sleeps in 1-s steps and the run's call returns only after the step
    in progress; these beats end with the run."""
    beats = Beats()
    with heartbeats(30, emit=beats):
        pass
    assert not beat_threads()
    assert len(beats.sent) == 1


def test_a_lost_beat_does_not_fail_the_run_and_the_next_ones_go(in_a_run: str) -> None:
    beats = Beats(failures=2)
    with heartbeats(0.02, emit=beats):
        time.sleep(0.2)
    assert beats.sent and beats.failures == 0


def test_outside_a_flow_run_nothing_beats() -> None:
    beats = Beats()
    with heartbeats(0.01, emit=beats):
        time.sleep(0.05)
    assert beats.sent == [] and not beat_threads()


def test_the_automation_waits_three_intervals_for_the_flows_own_beat() -> None:
    automation = zombie_automation(6)
    trigger: Any = automation.trigger
    assert trigger.within == timedelta(seconds=18) == timedelta(seconds=zombie_after(6))
    assert trigger.after == {HEARTBEAT_EVENT}
    assert HEARTBEAT_EVENT in trigger.expect and "prefect.flow-run.Completed" in trigger.expect
    action: Any = automation.actions[0]
    assert action.message.startswith("no heartbeat for 18 s")


def test_setup_reads_the_heartbeat_without_the_other_settings() -> None:
    """prefect-setup runs where the flows' other settings may not be given."""
    assert one_setting("heartbeat_seconds", {}) == 30.0
    assert one_setting("heartbeat_seconds", {"STORE_ROLLOUT_HEARTBEAT_SECONDS": "6"}) == 6.0
    with pytest.raises(ValueError, match="greater than or equal to 4"):
        one_setting("heartbeat_seconds", {"STORE_ROLLOUT_HEARTBEAT_SECONDS": "2"})
    with pytest.raises(SettingsError, match="heartbeat_seconds"):
        from store_rollout.settings import load_settings

        load_settings({"STORE_ROLLOUT_HEARTBEAT_SECONDS": "2"})


def test_one_setting_comes_from_the_same_sources_as_all_of_them(tmp_path: Path) -> None:
    """The heartbeat a flow run beats at is the one its settings give: the environment over the
    settings file over the default, without the other settings loading (none is given)."""
    path = tmp_path / "settings.env"
    path.write_text("STORE_ROLLOUT_HEARTBEAT_SECONDS=12\n")
    path.chmod(0o600)
    in_file = {"STORE_ROLLOUT_SETTINGS_FILE": str(path)}
    assert one_setting("heartbeat_seconds", in_file) == 12.0
    assert one_setting("heartbeat_seconds", {**in_file,
                                             "STORE_ROLLOUT_HEARTBEAT_SECONDS": "7"}) == 7.0
    # every setting prefect-setup reads alone, constrained or not
    assert one_setting("notification_block", in_file) == ""
    assert one_setting("regions_file", {"STORE_ROLLOUT_REGIONS_FILE": ""}) == ""
    assert one_setting("hypervisor_ready_expected_seconds", in_file) > 0
    with pytest.raises(SettingsError, match="salt_master_config"):
        from store_rollout.settings import load_settings

        load_settings(in_file)  # all of them: the required ones are missing


def test_the_commands_turn_prefects_own_heartbeat_off() -> None:
    """Prefect beats every 180 s by default, from a thread that held each in-process run's
    return for up to 1 s after it was Completed (docs/performance.md)."""
    from prefect.settings import get_current_settings

    from app.runner import command_prefect_settings

    assert get_current_settings().flows.heartbeat_frequency is not None
    with command_prefect_settings():
        assert get_current_settings().flows.heartbeat_frequency is None


def test_a_beating_flow_keeps_its_parameters_and_their_descriptions() -> None:
    """`beating` sits under `@flow`: the UI's form and the API's schema still show the flow's
    own parameters, typed and described."""
    from flows.rollout import store_rollout

    properties = store_rollout.parameters.properties
    assert list(properties)[:2] == ["store_id", "inventory"]
    assert "The store to roll out" in properties["store_id"]["description"]
    assert properties["ignore_windows"]["type"] == "boolean"


def test_prefect_setup_refuses_a_bad_heartbeat_before_touching_the_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 2 naming the variable, before the cobbler-sync limit or any automation is made
    (no Prefect server is reachable here: a call would fail differently)."""
    from typer.testing import CliRunner

    from app.cli import app

    monkeypatch.delenv("STORE_ROLLOUT_SETTINGS_FILE", raising=False)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv("STORE_ROLLOUT_HEARTBEAT_SECONDS", "2")
    result = CliRunner().invoke(app, ["prefect-setup"])
    assert result.exit_code == 2, result.output
    assert "STORE_ROLLOUT_HEARTBEAT_SECONDS='2'" in result.output
    assert "greater than or equal to 4" in result.output
    assert "cobbler-sync" not in result.output
