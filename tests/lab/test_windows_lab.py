"""Issue 30 in the lab: a rollout outside its store's maintenance window waits (the run page and
the operators' channel say why, nothing is powered), `--now` goes ahead at once and says it was
overridden; a batch schedules each store's run into its own window (Scheduled in the API and
the UI, the next wave only after the canary's); and, on the real clock (opt-in, `make
test-fleet`), a waiting rollout goes on by itself when its window opens and completes in it,
and a batch across three time zones starts every store inside its own window."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from lab.prefect_access import api_session
from lab.state import LabInfo
from tests import helpers
from tests.helpers import finish, notifications, power_actions, start_rollout, wait_for
from tests.lab.test_ui import Ui

pytestmark = pytest.mark.lab

TOKYO = ZoneInfo("Asia/Tokyo")
NEW_YORK = ZoneInfo("America/New_York")
# step 2 needs 2 minutes of window here (the settings' default is 45)
ENV = {"STORE_ROLLOUT_DISRUPTION_SECONDS": '{"pxe_install_hypervisor": 120}'}
WAITING = "waiting for its maintenance window"  # the notification's subject


def newest_run(lab: LabInfo, name: str) -> dict[str, Any]:
    runs = api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [name]}}, "sort": "START_TIME_DESC", "limit": 1},
        timeout=10).json()
    return runs[0] if runs else {}


def stores_with_windows(lab: LabInfo, tmp_path: Path, starts: dict[str, datetime]) -> Path:
    """An inventory of fresh stores (racked), each with one daily two-hour window from its
    start, in its start's time zone (room for steps 2 to 5 under the workers' settings: 45 +
    20 min)."""
    stamp = int(time.time()) % 0xFFFF
    ids = {f"w{stamp:04x}-{name}": start for name, start in starts.items()}
    inventory = helpers.write_inventory(tmp_path / "inv.yaml", list(ids),
                                        f"52:54:e7:{stamp >> 8:02x}:{stamp & 0xFF:02x}", lab=lab)
    raw = yaml.safe_load(inventory.read_text())
    for store in raw["stores"]:
        start = ids[store["store_id"]]
        end = start + timedelta(hours=2)
        store["calendar"] = {"time_zone": str(start.tzinfo),
                             "windows": [f"daily {start:%H:%M}-{end:%H:%M}"]}
    inventory.write_text(yaml.safe_dump(raw))
    return inventory


def awaiting(lab: LabInfo, store_id: str) -> dict[str, Any]:
    """The store's run, once its page says it awaits its window."""
    return wait_for(lambda: (r := newest_run(lab, f"rollout-{store_id}")).get("state_name")
                    == "AwaitingWindow" and r, timeout=120, what="the run to await its window")


@pytest.mark.extended
def test_outside_its_window_a_rollout_waits_saying_why_and_now_overrides(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], tmp_path: Path) -> None:
    """The waiting run is started as a user does from the UI or the API (the store-rollout
    deployment, run by the lab's worker), then cancelled there. The urgent store is rolled out
    by `make demo`'s command (`lab demo`), which overrides the windows as `rollout --now` does
    (tests/unit/store_rollout/test_disruption.py: --now is that override) and says so."""
    api = lab.prefect_api_url
    far = datetime.now(TOKYO) + timedelta(hours=6)
    inventory = stores_with_windows(lab, tmp_path, {"wait": far, "now": far})
    waits, urgent = (yaml.safe_load(inventory.read_text())["stores"][n]["store_id"] for n in (0, 1))
    deployment = wait_for(lambda: api_session(api).get(
        f"{api}/deployments/name/store-rollout/store-rollout", timeout=5).json().get("id"),
        timeout=90, what="the lab's store-rollout deployment")
    run = api_session(api).post(f"{api}/deployments/{deployment}/create_flow_run", json={
        "parameters": {"store_id": waits, "inventory": str(inventory)}}, timeout=10).json()
    try:
        demo_inventory = tmp_path / "demo.yaml"
        raw = yaml.safe_load(inventory.read_text())
        demo_inventory.write_text(yaml.safe_dump({**raw, "stores": raw["stores"][1:]}))
        demo = subprocess.run([str(helpers.VENV_BIN / "store-rollout"), "lab", "demo",
                               "--inventory", str(demo_inventory), "--state-dir", str(lab_dir)],
                              env={**lab_env, **ENV}, capture_output=True, text=True,
                              timeout=600, check=False)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "maintenance windows are overridden" in demo.stderr, demo.stderr[-3000:]
        summary = demo.stdout[demo.stdout.index("demo summary"):]
        assert urgent in summary and "Completed" in summary, summary
        assert power_actions(lab, f"store-{urgent}-hv") == {"on": 1, "off": 0}
        assert len(helpers.created_erp_notices(lab, urgent)) == 1

        message = awaiting(lab, waits)["state"]["message"]
        assert f"store {waits}: the store is outside its maintenance windows" in message, message
        assert f"waiting for the next window: {far:%a %Y-%m-%d %H:%M}" in message, message
        assert power_actions(lab, f"store-{waits}-hv") == {"on": 0, "off": 0}  # nothing done
        # the operators' channel says so, once
        said = wait_for(lambda: notifications(lab, f"rollout-{waits}: {WAITING}"), timeout=60,
                        what="the waiting rollout's notification")
        assert "the store is outside its maintenance windows" in said[0]["body"], said
        assert f"/runs/flow-run/{run['id']}" in said[0]["body"], said
    finally:  # cancelled from the API, as from the UI's button
        api_session(api).post(f"{api}/flow_runs/{run['id']}/set_state", json={
            "state": {"type": "CANCELLING"}, "force": True}, timeout=10)
    wait_for(lambda: newest_run(lab, f"rollout-{waits}")["state_type"] == "CANCELLED",
             timeout=120, what="the waiting run to be cancelled")
    assert len(notifications(lab, f"rollout-{waits}: {WAITING}")) == 1


def deployment_id(lab: LabInfo, name: str) -> str:
    return str(wait_for(lambda: api_session(lab).get(f"{lab.prefect_api_url}/deployments/name/{name}",
                                             timeout=5).json().get("id"),
                        timeout=90, what=f"the lab's {name} deployment"))


def store_runs(lab: LabInfo, store_ids: list[str]) -> dict[str, dict[str, Any]]:
    runs = api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{sid}" for sid in store_ids]}}},
        timeout=10).json()
    return {r["name"].removeprefix("rollout-"): r for r in runs}


def cancel(lab: LabInfo, run_id: str) -> None:
    """As the UI's Cancel button does."""
    api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/{run_id}/set_state", json={
        "state": {"type": "CANCELLING"}, "force": True}, timeout=10).raise_for_status()


@pytest.mark.extended
def test_a_batch_schedules_its_canary_into_its_window_and_waits_for_it(
        lab: LabInfo, tmp_path: Path, ui: Ui) -> None:
    """One run of the batch deployment across two time zones, both stores' windows hours
    ahead: the canary's run is Scheduled for its window's start (API and UI), the other store's
    is not created before the canary's has ended; cancelling the batch cancels its scheduled
    run, so nothing starts later unwatched."""
    api = lab.prefect_api_url
    tokyo = (datetime.now(TOKYO) + timedelta(hours=5)).replace(second=0, microsecond=0)
    new_york = (datetime.now(NEW_YORK) + timedelta(hours=7)).replace(second=0, microsecond=0)
    inventory = stores_with_windows(lab, tmp_path, {"tokyo": tokyo, "ny": new_york})
    canary, other = (s["store_id"] for s in yaml.safe_load(inventory.read_text())["stores"])
    batch = api_session(api).post(f"{api}/deployments/{deployment_id(lab, 'batch-rollout/batch-rollout')}"
                          "/create_flow_run", json={"parameters": {
                              "inventory": str(inventory), "canary": 1, "wave_size": 5}},
                          timeout=10).json()
    try:
        scheduled = wait_for(lambda: store_runs(lab, [canary]).get(canary), timeout=120,
                             what="the canary's scheduled run")
        assert scheduled["state_type"] == "SCHEDULED", scheduled
        # a second into its window (tasks/store_runs.py START_MARGIN)
        assert datetime.fromisoformat(scheduled["expected_start_time"]) == \
            tokyo.astimezone(UTC) + timedelta(seconds=1)
        assert scheduled["parameters"]["store_id"] == canary
        assert scheduled["parameters"]["hold_fleet_slot"] is True
        parent = api_session(api).get(f"{api}/task_runs/{scheduled['parent_task_run_id']}",
                              timeout=10).json()
        assert parent["flow_run_id"] == batch["id"]  # listed on the batch's page
        ui.goto(f"/runs/flow-run/{scheduled['id']}")  # its page: state, time, parent batch
        ui.page.get_by_text("Scheduled", exact=True).first.wait_for()
        ui.page.get_by_text("Scheduled for").first.wait_for()
        ui.shot("scheduled-store-run")
        page = ui.page.inner_text("body")
        assert f"rollout-{canary}" in page and "batch-5x-1c" in page, page[:500]  # its parent
        time.sleep(3)  # the batch polls its wave: still no run for the next one
        assert other not in store_runs(lab, [other])
        assert power_actions(lab, f"store-{canary}-hv") == {"on": 0, "off": 0}
    finally:
        cancel(lab, batch["id"])
    wait_for(lambda: store_runs(lab, [canary])[canary]["state_type"] == "CANCELLED",
             timeout=120, what="the batch's scheduled run cancelled with it")
    assert other not in store_runs(lab, [other])


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
    task_runs = api_session(lab).post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"name": {"any_": [f"pxe_install_hypervisor-{waits}"]}},
        "sort": "EXPECTED_START_TIME_ASC"}, timeout=10).json()
    assert [t["state_type"] for t in task_runs] == ["COMPLETED", "COMPLETED"], task_runs
    second = datetime.fromisoformat(task_runs[1]["start_time"])
    assert second >= opens.astimezone(UTC), (second, opens)
    assert newest_run(lab, f"rollout-{waits}")["state_name"] == "Completed"


@pytest.mark.fleet
def test_a_batch_across_three_time_zones_starts_every_store_inside_its_own_window(
        lab: LabInfo, tmp_path: Path) -> None:
    """The acceptance batch: 6 stores, two each in Tokyo, Berlin and New York, one of each pair
    in a window open now, the other's window opening in 1-2 minutes; one run of the batch
    deployment (canary 1, waves of 3, 3 in flight). Every store's run starts inside its own
    window, read back from the runs' start times in each store's local time."""
    api = lab.prefect_api_url
    now = datetime.now(UTC)
    opened = (now - timedelta(minutes=10)).replace(second=0, microsecond=0)  # 110 min left
    soon = (now + timedelta(seconds=120)).replace(second=0, microsecond=0)
    zones = {"tk": TOKYO, "be": ZoneInfo("Europe/Berlin"), "ny": NEW_YORK}
    starts = {f"{z}-{kind}": moment.astimezone(tz) for z, tz in zones.items()
              for kind, moment in (("open", opened), ("soon", soon))}
    inventory = stores_with_windows(lab, tmp_path, starts)
    stores = {s["store_id"]: s["calendar"] for s in yaml.safe_load(inventory.read_text())["stores"]}
    batch = api_session(api).post(f"{api}/deployments/{deployment_id(lab, 'batch-rollout/batch-rollout')}"
                          "/create_flow_run", json={"parameters": {
                              "inventory": str(inventory), "canary": 1, "wave_size": 3,
                              "max_in_flight": 3}}, timeout=10).json()
    ended = wait_for(lambda: (r := api_session(api).get(f"{api}/flow_runs/{batch['id']}", timeout=10)
                              .json())["state_type"] in ("COMPLETED", "FAILED", "CRASHED") and r,
                     timeout=900, interval=5, what="the batch to end")
    runs = store_runs(lab, list(stores))
    assert ended["state_type"] == "COMPLETED", (ended["state"], {
        sid: r["state_name"] for sid, r in runs.items()})
    assert {sid: r["state_type"] for sid, r in runs.items()} == dict.fromkeys(stores, "COMPLETED")
    scheduled_ahead = 0
    for sid, calendar in stores.items():
        run = runs[sid]
        tz = ZoneInfo(calendar["time_zone"])
        local_start = datetime.fromisoformat(run["start_time"]).astimezone(tz)
        window_start = datetime.strptime(calendar["windows"][0][6:11], "%H:%M").time()
        opens = datetime.combine(local_start.date(), window_start, tz)
        if opens > local_start:  # a window across local midnight opened the day before
            opens -= timedelta(days=1)
        assert opens <= local_start < opens + timedelta(hours=2), (sid, local_start, calendar)
        created = datetime.fromisoformat(run["created"])
        scheduled_ahead += datetime.fromisoformat(run["expected_start_time"]) > created
    # the pairs' second stores were created before their windows opened and waited for them
    assert scheduled_ahead >= 2, runs
