"""Issue 30 in the lab: a rollout outside its store's maintenance window waits (the run page and
the operators' channel say why, nothing is powered), `--now` goes ahead at once and says it was
overridden; and, on the real clock (opt-in, `make test-fleet`: up to a minute of waiting), a
waiting rollout goes on by itself when the window opens and completes in it."""

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
# step 2 needs 2 minutes of window here (the settings' default is 45)
ENV = {"STORE_ROLLOUT_DISRUPTION_SECONDS": '{"pxe_install_hypervisor": 120}'}


def newest_run(lab: LabInfo, name: str) -> dict[str, Any]:
    runs = requests.post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [name]}}, "sort": "START_TIME_DESC", "limit": 1},
        timeout=10).json()
    return runs[0] if runs else {}


def stores_with_windows(lab: LabInfo, tmp_path: Path, starts: dict[str, datetime]) -> Path:
    """An inventory of fresh stores (racked), each with one daily hour-long window in Tokyo
    time from its start."""
    stamp = int(time.time()) % 0xFFFF
    ids = {f"w{stamp:04x}-{name}": start for name, start in starts.items()}
    inventory = helpers.write_inventory(tmp_path / "inv.yaml", list(ids),
                                        f"52:54:e7:{stamp >> 8:02x}:{stamp & 0xFF:02x}", lab=lab)
    raw = yaml.safe_load(inventory.read_text())
    for store in raw["stores"]:
        start = ids[store["store_id"]]
        end = start + timedelta(hours=1)
        store["calendar"] = {"time_zone": "Asia/Tokyo",
                             "windows": [f"daily {start:%H:%M}-{end:%H:%M}"]}
    inventory.write_text(yaml.safe_dump(raw))
    return inventory


def awaiting(lab: LabInfo, store_id: str) -> dict[str, Any]:
    """The store's run, once its page says it awaits its window."""
    return wait_for(lambda: (r := newest_run(lab, f"rollout-{store_id}")).get("state_name")
                    == "AwaitingWindow" and r, timeout=120, what="the run to await its window")


def test_outside_its_window_a_rollout_waits_saying_why_and_now_overrides(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    """The waiting run is started as a user does from the UI or the API (the store-rollout
    deployment, run by the lab's worker), then cancelled there."""
    api = lab.prefect_api_url
    far = datetime.now(TOKYO) + timedelta(hours=6)
    inventory = stores_with_windows(lab, tmp_path, {"wait": far, "now": far})
    waits, urgent = (yaml.safe_load(inventory.read_text())["stores"][n]["store_id"] for n in (0, 1))
    deployment = wait_for(lambda: requests.get(
        f"{api}/deployments/name/store-rollout/store-rollout", timeout=5).json().get("id"),
        timeout=90, what="the lab's store-rollout deployment")
    run = requests.post(f"{api}/deployments/{deployment}/create_flow_run", json={
        "parameters": {"store_id": waits, "inventory": str(inventory)}}, timeout=10).json()
    try:
        overridden = finish(start_rollout({**lab_env, **ENV}, urgent, inventory, "--now"))
        assert overridden["state"] == "Completed" and overridden["window_overridden"] is True

        message = awaiting(lab, waits)["state"]["message"]
        assert f"store {waits}: the store is outside its maintenance windows" in message, message
        assert f"waiting for the next window: {far:%a %Y-%m-%d %H:%M}" in message, message
        assert power_actions(lab, f"store-{waits}-hv") == {"on": 0, "off": 0}  # nothing done
        # the operators' channel says so, once
        said = wait_for(lambda: notifications(lab, f"rollout-{waits}: waits"), timeout=60,
                        what="the waiting rollout's notification")
        assert "the store is outside its maintenance windows" in said[0]["body"], said
        assert f"/runs/flow-run/{run['id']}" in said[0]["body"], said
    finally:  # cancelled from the API, as from the UI's button
        requests.post(f"{api}/flow_runs/{run['id']}/set_state", json={
            "state": {"type": "CANCELLING"}, "force": True}, timeout=10)
    wait_for(lambda: newest_run(lab, f"rollout-{waits}")["state_type"] == "CANCELLED",
             timeout=120, what="the waiting run to be cancelled")
    assert len(notifications(lab, f"rollout-{waits}: waits")) == 1


@pytest.mark.fleet
def test_a_waiting_rollout_goes_on_when_its_window_opens_and_completes_in_it(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    # 15 to 75 s ahead (windows are whole minutes): time for the run to reach step 2 first
    opens = (datetime.now(TOKYO) + timedelta(seconds=75)).replace(second=0, microsecond=0)
    inventory = stores_with_windows(lab, tmp_path, {"soon": opens})
    waits = yaml.safe_load(inventory.read_text())["stores"][0]["store_id"]
    waiting = start_rollout({**lab_env, **ENV}, waits, inventory)
    awaiting(lab, waits)
    assert power_actions(lab, f"store-{waits}-hv") == {"on": 0, "off": 0}
    result = finish(waiting)
    assert result["state"] == "Completed" and result["window_overridden"] is False
    assert power_actions(lab, f"store-{waits}-hv") == {"on": 1, "off": 0}
    # step 2 asked twice: outside the window (nothing done), then in it (the install)
    task_runs = requests.post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"name": {"any_": [f"pxe_install_hypervisor-{waits}"]}},
        "sort": "EXPECTED_START_TIME_ASC"}, timeout=10).json()
    assert [t["state_type"] for t in task_runs] == ["COMPLETED", "COMPLETED"], task_runs
    second = datetime.fromisoformat(task_runs[1]["start_time"])
    assert second >= opens.astimezone(UTC), (second, opens)
    assert newest_run(lab, f"rollout-{waits}")["state_name"] == "Completed"
