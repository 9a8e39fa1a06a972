"""Issue 49 in the lab: offline-first runs. A store's WAN link (lab/wan.py, the fault knob: every
packet of the store's machines dropped, silent like a real cut) is cut for 2 minutes once step 5
has created its VM: the run is not failed, its state says "store <id> link down since <UTC>"
(the API, as the UI shows it), and when the link is back the run goes on by itself, its state
Running again, and completes; the VM passes go-live. The store's minions came back by
themselves: nobody restarted them (the hypervisor's minion kept its process), their link
settings (store_rollout/contracts.py MINION_LINK_SETTINGS) did it.

Then the same store is cut again: the wait fails at its bound naming the silence, and after the
restore both minions answer again by themselves, in the same processes.

Fleet tier (`make test-fleet`): about 6 minutes of the real clock."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from lab.prefect_access import api_session
from lab.state import LabInfo
from store_rollout.inventory import load_inventory
from tasks.salt import SaltError, SaltMasterClient
from tasks.store_link import StoreLink, StoreLinkLost
from tests import helpers
from tests.helpers import finish, go_live_table, start_rollout, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.fleet]

CUT_SECONDS = 120.0
DOWN = re.compile(r"^store (\S+) link down since (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$")


def the_run(lab: LabInfo, name: str) -> dict[str, Any]:
    runs = api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [name]}}, "sort": "START_TIME_DESC", "limit": 1},
        timeout=10).json()
    return runs[0] if runs else {}


def task_state(lab: LabInfo, run_id: str, task_name: str) -> str | None:
    tasks = api_session(lab).post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"flow_run_id": {"any_": [run_id]}}}, timeout=10).json()
    return next((t["state_type"] for t in tasks if t["name"] == task_name), None)


def run_states(lab: LabInfo, run_id: str) -> list[dict[str, Any]]:
    states: list[dict[str, Any]] = api_session(lab).get(
        f"{lab.prefect_api_url}/flow_run_states/", params={"flow_run_id": run_id},
        timeout=10).json()
    return sorted(states, key=lambda s: s["timestamp"])


def minion_record(lab: LabInfo, minion: str) -> tuple[int | None, list[dict[str, Any]]]:
    """The simulator's record of a machine's minion: its running pid and its start/stop history."""
    seen = requests.get(f"{lab.simulator_url}/minions", timeout=10).json()
    running = seen["running"].get(minion) or {}
    return running.get("pid"), [h for h in seen["history"] if h["minion"] == minion]


@pytest.fixture
def wan() -> Any:
    """The lab's WAN knob (lab/wan.py: cut_store_link, restore_store_link, store_link)."""
    import lab.wan

    return lab.wan


def test_a_link_cut_after_step_5_is_waited_out_and_the_run_completes_unattended(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path, wan: Any) -> None:

    store_id = "off49"
    hv = f"store-{store_id}-hv"
    inventory = helpers.write_inventory(tmp_path / "inv.yaml", [store_id], "52:54:00:49:0f",
                                        lab=lab)
    proc = start_rollout(lab_env, store_id, inventory)
    try:
        run = wait_for(lambda: the_run(lab, f"rollout-{store_id}") or None, timeout=120,
                       what="the rollout's flow run")
        wait_for(lambda: task_state(lab, run["id"], f"create_vm-{store_id}") == "COMPLETED",
                 timeout=420, interval=0.5, what="step 5 (the VM created)")
        hv_pid, _ = minion_record(lab, hv)
        wan.cut_store_link(lab, store_id)
        cut_at = time.time()
        assert wan.store_link(lab, store_id)["cut"] is True
        # the run waits, saying so: state StoreLinkDown, its message naming the store and when;
        # still waiting at the end of the cut (silence is not failure)
        steps = {step: task_state(lab, run["id"], f"{step}-{store_id}")
                 for step in ("firstboot", "go_live")}
        seen: list[tuple[float, str, str]] = []
        while time.time() < cut_at + CUT_SECONDS:
            now = the_run(lab, f"rollout-{store_id}")
            state = (now.get("state_name", ""), (now.get("state") or {}).get("message") or "")
            if not seen or seen[-1][1:] != state:
                seen.append((round(time.time() - cut_at, 1), *state))
            time.sleep(1)
        ended = proc.poll() is not None
        story = f"steps at the cut: {steps}; states since the cut: {seen}; " + (
            f"the rollout ended: {proc.communicate()[1][-4000:]}" if ended else "")
        down = [message for _, name, message in seen if name == "StoreLinkDown"]
        assert down and not ended, story
        said = DOWN.match(down[0])
        assert said and said.group(1) == store_id, story
        assert seen[-1][1] == "StoreLinkDown", story
    finally:
        wan.restore_store_link(lab, store_id)
        restored_at = time.time()
    result = finish(proc)  # unattended: nothing is done to the store but the restore
    states = [(s["name"], s.get("message") or "") for s in run_states(lab, run["id"])]
    names = [name for name, _ in states]
    first_down = names.index("StoreLinkDown")
    back = [i for i, (name, message) in enumerate(states)
            if i > first_down and name == "Running" and "link back" in message]
    assert back, states  # the run's state went back to plain Running when the store answered
    back_at = datetime.fromisoformat(run_states(lab, run["id"])[back[0]]["timestamp"])
    print(f"offline-first: the run said its link was back {back_at.timestamp() - restored_at:.0f} s "
          "after the restore")
    assert names[-1] == "Completed", states
    # the VM passed go-live
    rows = go_live_table(lab, store_id)
    assert rows and all(r["result"] == "pass" for r in rows), rows
    helpers.check_store(lab, store_id, result)
    # the hypervisor's minion came back by itself: the same process, never stopped or started
    # after the cut (the VM's minion restarts are its firstboot's own reboots)
    pid, history = minion_record(lab, hv)
    assert pid == hv_pid and pid is not None
    assert [h for h in history if h["at"] >= cut_at] == [], history
    the_bound_names_the_silence_and_the_minions_come_back(lab, wan, store_id, inventory)


def the_bound_names_the_silence_and_the_minions_come_back(lab: LabInfo, wan: Any, store_id: str,
                                                           inventory: Path) -> None:
    """The same store, rolled out, cut again: the wait (tasks/store_link.py) against the real
    master fails at its bound naming the silence; after the restore both minions answer again
    by themselves, in the same processes."""
    store = load_inventory(str(inventory)).get(store_id)
    master = SaltMasterClient(lab.salt_master_config)
    minions = [store.hypervisor_minion_id, store.vm_minion_id]
    pids = {m: minion_record(lab, m)[0] for m in minions}
    wan.cut_store_link(lab, store_id)
    try:
        started = time.monotonic()
        with pytest.raises(StoreLinkLost) as lost:
            StoreLink(master, store, 30, say=lambda name, message: None).hold()
        assert 30 <= time.monotonic() - started <= 30 + 2 * 7 + 10 + 5
        assert str(lost.value).startswith(f"store {store_id}: its minions {', '.join(minions)} "
                                          "have been silent since "), lost.value
        assert "raise STORE_ROLLOUT_STORE_LINK_WAIT_SECONDS" in str(lost.value)
    finally:
        wan.restore_store_link(lab, store_id)
    restored = time.monotonic()

    def each_answers() -> bool:
        for minion in minions:
            try:
                master.cmd(minion, "test.ping", timeout=5, gather_job_timeout=2)
            except SaltError:
                return False
        return True

    wait_for(each_answers, timeout=240, interval=2, what="both minions to answer by themselves")
    print(f"offline-first: both minions answered {time.monotonic() - restored:.0f} s after the "
          "restore of a cut of about 45 s")
    assert {m: minion_record(lab, m)[0] for m in minions} == pids  # nobody restarted them
