"""Issue 31, regions, in a two-region lab (opt-in, `make test-fleet`): the lab's default region
and r2, each with its own Salt master and worker on its own work pool, one Prefect server. A
batch of four stores (two per region) dispatches each store as a run of its region's deployment.
With the default region's master stopped, r2's stores complete and the default region's fail
naming that master; with the master back, a rerun of the batch completes them without touching
r2's (no new run, no power action, no ERP notice). Each store's keys sit on its own region's
master only. The unit tests of the same rules: tests/unit/store_rollout/test_regions.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.prefect_access import api_session
from lab.state import VENV_BIN, LabInfo
from tests.helpers import (
    check_store,
    created_erp_notices,
    power_actions,
    result_from_systems,
    write_inventory,
)
from tests.lab.test_api_workers import workers_that_took
from tests.lab.test_plan_reconcile import store_events

pytestmark = [pytest.mark.lab, pytest.mark.fleet]

A_STORES, B_STORES = ["rg-a1", "rg-a2"], ["rg-b1", "rg-b2"]


def batch(lab_env: dict[str, str], inventory: Path) -> dict[str, dict[str, Any]]:
    """`store-rollout batch --json` of the four stores, each region's two in its canary wave
    (so both of a region meet its master), as a technician runs it."""
    done = subprocess.run([str(VENV_BIN / "store-rollout"), "batch", "--inventory", str(inventory),
                           "--canary", "2", "--max-in-flight", "4", "--json"],
                          env=lab_env, capture_output=True, text=True, timeout=600)
    assert done.stdout.strip(), done.stderr[-3000:]
    return {row["store_id"]: row for row in json.loads(done.stdout)}


def accepted_keys(master_config: str) -> dict[str, list[str]]:
    """Every key a master holds, by state, as `salt-key -L` lists them (a process of its own:
    Salt's wheel modules in one process share one master's options)."""
    listed = subprocess.run([str(VENV_BIN / "salt-key"), "-c", str(Path(master_config).parent),
                             "--list", "all", "--out", "json"],
                            capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(listed.stdout))


def runs_of(lab: LabInfo, store_id: str) -> list[dict[str, Any]]:
    return list(api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{store_id}"]}}, "sort": "START_TIME_DESC"},
        timeout=10).json())


def test_two_regions_each_on_its_own_master(lab: LabInfo, lab_dir: Path,
                                             lab_env: dict[str, str], tmp_path: Path) -> None:
    from lab.manager import Lab

    instance = Lab.at(lab_dir)
    info = instance.up(regions=2)
    try:
        region_b = info.model_copy(update={"salt_master_config": info.region2_salt_master_config})
        view = {sid: info for sid in A_STORES} | {sid: region_b for sid in B_STORES}
        inventory = write_inventory(tmp_path / "inventory.yaml", A_STORES + B_STORES,
                                    "52:54:00:c7:00", lab=info,
                                    regions=dict.fromkeys(B_STORES, "r2"))
        instance.stop_service("salt-master")  # region default's
        first = batch(lab_env, inventory)
        for sid in B_STORES:
            assert first[sid]["state"] == "Completed" and first[sid]["region"] == "r2", first[sid]
        for sid in A_STORES:
            row = first[sid]
            assert row["state"] == "Failed" and row["step_reached"] == "validation", row
            assert ("the Salt master of region 'default' "
                    f"({info.salt_master_config}, id 'lab-master') does not answer") in row["error"]
        instance.up()  # the master is back
        b_before = {sid: (power_actions(info, f"store-{sid}-hv"),
                          len(created_erp_notices(info, sid)), len(runs_of(info, sid)))
                    for sid in B_STORES}
        second = batch(lab_env, inventory)
        for sid in A_STORES:
            assert second[sid]["state"] == "Completed", second[sid]
        for sid in B_STORES:  # left as they were: no run, no power action, no notice
            assert second[sid]["earlier_run"].startswith(f"rollout-{sid}, ended "), second[sid]
            assert (power_actions(info, f"store-{sid}-hv"), len(created_erp_notices(info, sid)),
                    len(runs_of(info, sid))) == b_before[sid]
        keys = {"default": accepted_keys(info.salt_master_config),
                "r2": accepted_keys(info.region2_salt_master_config)}
        for sid in A_STORES + B_STORES:
            own, other = ("r2", "default") if sid in B_STORES else ("default", "r2")
            pool = "rollout-r2" if own == "r2" else "rollout-pool"
            runs = runs_of(info, sid)
            assert {run["work_pool_name"] for run in runs} == {pool}
            worker = "lab-worker-r2" if own == "r2" else "lab-worker"
            taken = workers_that_took(info.prefect_api_url, [r["id"] for r in runs])
            assert all(names == {f"prefect.worker.process.{worker}"}
                       for names in taken.values()), taken
            for minion in (f"store-{sid}-hv", f"store-{sid}-vm"):
                assert minion in keys[own]["minions"], (own, minion, keys[own])
                assert not any(minion in names for names in keys[other].values()), (other, minion)
            erp = created_erp_notices(info, sid)
            assert len(erp) == 1, erp
            # its master forwarded its Salt events to the one Prefect server
            assert store_events(info, sid, "salt.store."), sid
            check_store(view[sid], sid, {**result_from_systems(view[sid], sid),
                                         "erp_id": erp[0]["erp_id"]})
        check_chain_wide_reads(info, lab_env, inventory)
    finally:
        instance.up(regions=1)


def cli_json(lab_env: dict[str, str], *args: str) -> Any:
    done = subprocess.run([str(VENV_BIN / "store-rollout"), *args, "--json"], env=lab_env,
                          capture_output=True, text=True, timeout=600)
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout)


def check_chain_wide_reads(info: LabInfo, lab_env: dict[str, str], inventory: Path) -> None:
    """`reconcile` and `plan` from the default region read r2's stores through a run of r2's
    copy of their deployment, on r2's worker, and report every store as rolled out."""
    reconciled = cli_json(lab_env, "reconcile", "--inventory", str(inventory))
    assert reconciled["counts"] == {"ok": 4}, reconciled
    planned = cli_json(lab_env, "plan", *A_STORES[:1], *B_STORES[:1], "--inventory",
                       str(inventory), "--no-highstate-test")
    assert {sid: p["todo"] for sid, p in planned.items()} == {A_STORES[0]: [], B_STORES[0]: []}
    # each store's platform, r2's as r2's run resolved it
    platforms = {s["store_id"]: s["hypervisor"]["platform"]
                 for s in yaml.safe_load(inventory.read_text())["stores"]}
    assert {sid: p["platform"] for sid, p in planned.items()} == {
        sid: platforms[sid] for sid in (A_STORES[0], B_STORES[0])}
    api = info.prefect_api_url
    for flow_name in ("store-reconcile", "store-plan"):
        deployment = api_session(api).get(f"{api}/deployments/name/{flow_name}/{flow_name}-r2",
                                  timeout=10).json()
        runs = api_session(api).post(f"{api}/flow_runs/filter", json={
            "flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}}, timeout=10).json()
        assert [(r["state_type"], r["work_pool_name"], r["parameters"]["store_ids"])
                for r in runs] == [("COMPLETED", "rollout-r2",
                                    B_STORES if flow_name == "store-reconcile" else B_STORES[:1])]
        taken = workers_that_took(api, [runs[0]["id"]])
        assert taken == {runs[0]["id"]: {"prefect.worker.process.lab-worker-r2"}}, taken
