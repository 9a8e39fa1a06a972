"""Issue 17: a fleet-wide slot held by a process that dies is given back within a bound, even
across a Prefect server restart, and a missing limit is an error, never a silent pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import requests
from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError

from lab.manager import Lab
from lab.prefect_access import PrefectAccess, api_session
from lab.state import REPO_ROOT, LabInfo
from tasks.cobbler import CobblerClient
from tasks.slots import (
    COBBLER_SYNC_LIMIT,
    IN_FLIGHT_LIMIT,
    LEASE_SECONDS,
    fleet_slot,
    limit_problem,
    set_limit,
)
from tests.helpers import (
    check_store,
    created_erp_notices,
    finish,
    start_rollout,
    wait_for,
    wait_state,
    write_inventory,
)

pytestmark = pytest.mark.lab

# a dead holder's slot: its lease runs out, the repossessor (every 15 s) frees the slot, a
# waiting client asks again within 30 s (the server's Retry-After cap)
SLOT_BOUND = LEASE_SECONDS + 15 + 30 + 10

HOLDER = """
import sys, time
from prefect import flow
from tasks.cobbler import CobblerClient
from tasks.slots import fleet_slot

@flow(name="slot-holder")
def hold(name: str) -> None:
    with fleet_slot(name):
        print("held", flush=True)
        time.sleep(3600)

hold(sys.argv[1])
"""


@pytest.fixture
def lab_prefect(lab: LabInfo, lab_dir: Path) -> Iterator[None]:
    with PrefectAccess.of(lab).settings():
        yield


def start_holder(lab_env: dict[str, str], name: str) -> subprocess.Popen[str]:
    """A flow run (its own process and process group) that takes one slot of `name` and keeps it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name], env=lab_env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the slot is taken (or the process ended)
    assert line.strip() == "held", proc.stderr.read() if proc.stderr else line
    return proc


def slot_is_free(name: str, within: float) -> bool:
    try:
        with fleet_slot(name, timeout_seconds=within):
            return True
    except TimeoutError:
        return False


@pytest.mark.fleet
def test_dead_holder_of_cobbler_sync_blocks_others_only_for_the_bound_even_across_a_restart(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], lab_prefect: None,
        tmp_path: Path) -> None:
    holder = start_holder(lab_env, COBBLER_SYNC_LIMIT)
    try:
        assert not slot_is_free(COBBLER_SYNC_LIMIT, within=3)
        # the server restarts while the slot is held: the lease is on disk, so the holder keeps
        # renewing it and the slot stays held (with the default in-memory storage the lease is
        # gone: the holder's renewal fails, and once it dies the slot stays taken for good)
        Lab.at(lab_dir).stop_service("prefect-server")
        Lab.at(lab_dir).up()
        assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
        assert not slot_is_free(COBBLER_SYNC_LIMIT, within=3)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # kill -9 inside the sync window
        holder.wait()
    killed = time.monotonic()
    # another store's rollout waits at its Cobbler sync (step 2), then completes
    inv = write_inventory(tmp_path / "inv.yaml", ["slot-b"], "52:54:00:e5:00", lab=lab)
    result = finish(start_rollout(lab_env, "slot-b", inv))
    waited = time.monotonic() - killed
    assert result["state"] == "Completed"
    step2 = result["step_seconds"]["pxe_install_hypervisor"]
    print(f"slot back after the holder's kill -9: step 2 took {step2:.1f} s "
          f"(rollout {waited:.1f} s after the kill; bound {SLOT_BOUND} s)")
    assert step2 < SLOT_BOUND, result["step_seconds"]


def flow_run_process(run_id: str) -> int:
    """The PID of the process a worker started for this flow run (its environment names it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PREFECT__FLOW_RUN_ID={run_id}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no process runs flow run {run_id}")


def in_flight_taken(api: str) -> int:
    """Slots of stores-in-flight taken (0 before the first batch creates the limit)."""
    resp = api_session(api).get(f"{api}/v2/concurrency_limits/{IN_FLIGHT_LIMIT}", timeout=5)
    if resp.status_code == 404:
        return 0
    resp.raise_for_status()
    return int(resp.json()["active_slots"])


@pytest.mark.fleet
def test_worker_run_batch_killed_holding_stores_in_flight_frees_it_within_the_bound(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    """A batch run by the lab's worker (created through the REST API) holds the fleet's only
    stores-in-flight slot while its store waits in step 3; its process is killed with
    SIGKILL. The worker reports it Crashed, and the next batch's store gets the slot within the
    bound, then completes."""
    api = lab.prefect_api_url
    inv = write_inventory(tmp_path / "inv.yaml", ["slot-wa", "slot-wb"], "52:54:00:e5:10", lab=lab)
    deployment = api_session(api).get(f"{api}/deployments/name/batch-rollout/batch-rollout",
                              timeout=10).json()

    def batch(store: str) -> str:
        run = api_session(api).post(f"{api}/deployments/{deployment['id']}/create_flow_run", json={
            "parameters": {"inventory": str(inv), "store_ids": [store], "canary": 0,
                           "wave_size": 1, "max_in_flight": 1}}, timeout=10).json()
        return str(run["id"])

    requests.post(f"{lab.simulator_url}/faults/pxe", json={"delay": 600}, timeout=5)
    try:
        first = batch("slot-wa")
        wait_for(lambda: in_flight_taken(api) == 1, timeout=180, interval=1,
                 what="the first batch's store holding stores-in-flight")
        os.kill(flow_run_process(first), signal.SIGKILL)
        killed = time.time()
    finally:
        requests.delete(f"{lab.simulator_url}/faults", timeout=5)
    assert wait_state(api, first, 120) == "CRASHED"
    second = batch("slot-wb")
    assert wait_state(api, second, 600) == "COMPLETED"
    store_run = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": ["rollout-slot-wb"]}}}, timeout=10).json()
    assert store_run and store_run[0]["state_type"] == "COMPLETED", store_run
    waited = datetime.fromisoformat(store_run[0]["start_time"]).timestamp() - killed
    print(f"stores-in-flight back after the worker-run batch's kill -9: the next store started "
          f"{waited:.1f} s after the kill (bound {SLOT_BOUND} s)")
    assert waited < SLOT_BOUND
    assert in_flight_taken(api) == 0


def test_missing_cobbler_sync_limit_is_an_error_before_anything_happens(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], lab_prefect: None,
        tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.delete_global_concurrency_limit_by_name(COBBLER_SYNC_LIMIT)
    try:
        problem = limit_problem(COBBLER_SYNC_LIMIT, 1)
        assert problem and "global-concurrency-limit create cobbler-sync --limit 1" in problem
        inv = write_inventory(tmp_path / "inv.yaml", ["slot-missing"], "52:54:00:e5:01", lab=lab)
        proc = start_rollout(lab_env, "slot-missing", inv)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (out, err[-2000:])
        assert "no global concurrency limit 'cobbler-sync'" in err, err[-2000:]
        # refused before any side effect: no Cobbler system for the store
        cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                                password=lab.cobbler_password)
        assert cobbler.get_system("store-slot-missing-hv") is None
        # and a strict acquisition fails instead of passing without a slot
        with pytest.raises(ConcurrencySlotAcquisitionError, match="must be created"), \
                fleet_slot(COBBLER_SYNC_LIMIT, timeout_seconds=5):
            pass
    finally:
        set_limit(COBBLER_SYNC_LIMIT, 1)
    wait_for(lambda: limit_problem(COBBLER_SYNC_LIMIT, 1) is None, timeout=10,
             what="cobbler-sync back")


@pytest.mark.extended
def test_two_api_runs_of_one_store_one_owner(lab: LabInfo, lab_env: dict[str, str],
                                             tmp_path: Path) -> None:
    """A UI click and a batch (here: two REST API runs) of one store at once: one rolls it out,
    the other waits `owner_wait_seconds`, sees the owner alive (its heartbeat), and fails naming
    it, having changed nothing."""
    api, sid = lab.prefect_api_url, "slot-twice"
    inv = write_inventory(tmp_path / "inv.yaml", [sid], "52:54:00:e5:02", lab=lab)
    deployment = api_session(api).get(f"{api}/deployments/name/store-rollout/store-rollout",
                              timeout=10).json()
    # the owner's PXE install takes 20 s: it is still running (and beating, every 6 s in the
    # lab) when the other run decides after its owner_wait_seconds (10), as a rollout is while
    # someone clicks again
    requests.post(f"{lab.simulator_url}/faults/pxe", json={"delay": 20}, timeout=5)
    try:
        runs = [api_session(api).post(f"{api}/deployments/{deployment['id']}/create_flow_run", json={
            "parameters": {"store_id": sid, "inventory": str(inv)}}, timeout=10).json()
            for _ in range(2)]
        states = {run["id"]: wait_state(api, run["id"], 600) for run in runs}
    finally:
        requests.delete(f"{lab.simulator_url}/faults", timeout=5)
    assert sorted(states.values()) == ["COMPLETED", "FAILED"], states
    owner = next(rid for rid, state in states.items() if state == "COMPLETED")
    refused = next(rid for rid, state in states.items() if state == "FAILED")
    message = api_session(api).get(f"{api}/flow_runs/{refused}", timeout=5).json()["state"]["message"]
    assert (f"store {sid} is being rolled out or rolled back by flow run 'rollout-{sid}' "
            f"(id {owner}, Running since") in message, message
    assert "changed nothing" in message, message
    erp = created_erp_notices(lab, sid)
    assert len(erp) == 1, erp
    # the store is free again: its rerun resumes, and there is one Cobbler system, domain,
    # key and ERP notice
    again = finish(start_rollout(lab_env, sid, inv))
    assert again["state"] == "Completed" and again["erp_id"] == erp[0]["erp_id"]
    assert again["hypervisor_reinstalled"] is False, again
    check_store(lab, sid, again)
    assert created_erp_notices(lab, sid) == erp
