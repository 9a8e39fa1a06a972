"""Issue 30 in the lab: a rollout outside its store's maintenance window waits for the window
(the run page says so), then completes; `--now` goes ahead at once and says it was overridden."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests
import yaml

from lab.state import LabInfo
from tests import helpers
from tests.helpers import finish, notifications, power_actions, start_rollout, wait_for

pytestmark = pytest.mark.lab

TOKYO = ZoneInfo("Asia/Tokyo")


def newest_run(lab: LabInfo, name: str) -> dict[str, Any]:
    runs = requests.post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [name]}}, "sort": "START_TIME_DESC", "limit": 1},
        timeout=10).json()
    return runs[0] if runs else {}


def with_calendars(inventory: Path, calendars: dict[str, dict[str, Any]]) -> None:
    raw = yaml.safe_load(inventory.read_text())
    for store in raw["stores"]:
        if store["store_id"] in calendars:
            store["calendar"] = calendars[store["store_id"]]
    inventory.write_text(yaml.safe_dump(raw))


def test_a_rollout_waits_for_its_window_and_an_override_does_not(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    stamp = int(time.time()) % 0xFFFF
    waits, urgent = f"w{stamp:04x}-wait", f"w{stamp:04x}-now"
    inventory = helpers.write_inventory(tmp_path / "inv.yaml", [waits, urgent],
                                f"52:54:e7:{stamp >> 8:02x}:{stamp & 0xFF:02x}", lab=lab)
    # Tokyo time: `waits`' only window opens at the next full minute; `urgent`'s is 12 h away
    now = datetime.now(TOKYO)
    # 15 to 75 s ahead: time for the run to reach step 2 first
    opens = (now + timedelta(seconds=75)).replace(second=0, microsecond=0)
    far = now + timedelta(hours=12)
    def hour_from(start: datetime) -> dict[str, Any]:
        end = start + timedelta(hours=1)
        return {"time_zone": "Asia/Tokyo", "windows": [f"daily {start:%H:%M}-{end:%H:%M}"]}

    with_calendars(inventory, {waits: hour_from(opens), urgent: hour_from(far)})
    env = {**lab_env, "STORE_ROLLOUT_DISRUPTION_SECONDS": '{"pxe_install_hypervisor": 120}'}
    waiting = start_rollout(env, waits, inventory)
    overridden = finish(start_rollout(env, urgent, inventory, "--now"))
    assert overridden["state"] == "Completed" and overridden["window_overridden"] is True

    # the waiting run's page: its state says it waits for the window, and until when
    run = wait_for(lambda: (r := newest_run(lab, f"rollout-{waits}")).get("state_name")
                   == "AwaitingWindow" and r, timeout=120, what="the run to await its window")
    message = run["state"]["message"]
    assert f"store {waits}: the store is outside its maintenance windows" in message, message
    assert f"waiting for the next window: {opens:%a %Y-%m-%d %H:%M}" in message, message
    assert power_actions(lab, f"store-{waits}-hv") == {"on": 0, "off": 0}  # nothing yet

    # and the operators' channel says so, once
    said = wait_for(lambda: notifications(lab, f"rollout-{waits}: waits"), timeout=60,
                    what="the waiting rollout's notification")
    assert "the store is outside its maintenance windows" in said[0]["body"], said

    result = finish(waiting)
    assert len(notifications(lab, f"rollout-{waits}: waits")) == 1
    assert result["state"] == "Completed" and result["window_overridden"] is False
    assert power_actions(lab, f"store-{waits}-hv") == {"on": 1, "off": 0}
    # step 2's change came in the window: the host was powered on after it opened
    task_runs = requests.post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"name": {"any_": [f"pxe_install_hypervisor-{waits}"]}},
        "sort": "EXPECTED_START_TIME_ASC"}, timeout=10).json()
    assert [t["state_type"] for t in task_runs] == ["COMPLETED", "COMPLETED"], task_runs
    second = datetime.fromisoformat(task_runs[1]["start_time"])
    assert second >= opens.astimezone(UTC), (second, opens)
