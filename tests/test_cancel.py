"""Issue 5: cancelling a rollout (run by the lab's worker) through the API cleans up a store
that never went live; issue 43: cancelling a run of a live store (paused for its approval)
leaves the store as it is; `store-rollout rollback --yes`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from lab.state import LabInfo
from tasks.cobbler import CobblerClient
from tasks.salt import SaltMasterClient
from tests.helpers import check_store, cli_in_process, finish, start_rollout, wait_for, write_inventory

pytestmark = pytest.mark.lab


def domains(lab: LabInfo) -> list[str]:
    import libvirt

    conn = libvirt.open(lab.libvirt_uri)
    try:
        return [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


def domain_running(lab: LabInfo, name: str) -> bool:
    import libvirt

    conn = libvirt.open(lab.libvirt_uri)
    try:
        return bool(conn.lookupByName(name).isActive())
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def rolled_back(lab: LabInfo, store_id: str) -> bool:
    """The rollback's last traces gone: domain, overlay disk and key (assert_rolled_back says
    which one is left)."""
    vm = f"store-{store_id}-vm"
    return (vm not in domains(lab) and not (Path(lab.vm_images_dir) / vm).exists()
            and SaltMasterClient(lab.salt_master_config).key_state(vm) is None)


def assert_rolled_back(lab: LabInfo, store_id: str) -> None:
    vm = f"store-{store_id}-vm"
    assert vm not in domains(lab)
    assert not (Path(lab.vm_images_dir) / vm).exists()  # overlay disk removed
    master = SaltMasterClient(lab.salt_master_config)
    assert master.key_state(vm) is None and master.token_for(vm) is None
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    system = cobbler.get_system(f"store-{store_id}-hv")
    assert system is None or system["netboot_enabled"] is False


def test_cancel_through_api_rolls_back_then_rerun_and_rollback_command(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    store_id = "c-cancel"
    inv = write_inventory(tmp_path / "inv.yaml", [store_id], "52:54:00:cc:00", lab=lab)
    api = lab.prefect_api_url
    def deployment_id() -> str | None:
        resp = requests.get(f"{api}/deployments/name/store-rollout/store-rollout", timeout=5)
        return resp.json()["id"] if resp.status_code == 200 else None

    wait_for(lambda: deployment_id() is not None, timeout=90,
             what="the lab's store-rollout deployment")
    run = requests.post(f"{api}/deployments/{deployment_id()}/create_flow_run", json={
        "parameters": {"store_id": store_id, "inventory": str(inv)}}, timeout=10).json()
    # cancelled once its VM runs: the rerun below then needs a fresh disk for the new domain
    wait_for(lambda: domain_running(lab, f"store-{store_id}-vm"), timeout=300,
             what="step 5 (VM running)")
    requests.post(f"{api}/flow_runs/{run['id']}/set_state", json={
        "state": {"type": "CANCELLING"}, "force": True}, timeout=10).raise_for_status()

    def run_state() -> str:
        return str(requests.get(f"{api}/flow_runs/{run['id']}", timeout=5).json()["state_type"])

    wait_for(lambda: run_state() == "CANCELLED", timeout=120, what="the run to be cancelled")
    wait_for(lambda: rolled_back(lab, store_id), timeout=120, what="the rollback")
    assert_rolled_back(lab, store_id)

    # a cancelled rollout can be retried from scratch ...
    result = finish(start_rollout(lab_env, store_id, inv))
    check_store(lab, store_id, result)
    # ... a run of the live store that would recreate its VM waits for its approval; cancelled
    # there, it leaves the live store as it is (issue 43: cancel is not rollback)
    paused = requests.post(f"{api}/deployments/{deployment_id()}/create_flow_run", json={
        "parameters": {"store_id": store_id, "inventory": str(inv), "recreate_vm": True}},
        timeout=10).json()

    def paused_state() -> str:
        return str(requests.get(f"{api}/flow_runs/{paused['id']}", timeout=5).json()["state_type"])

    wait_for(lambda: paused_state() == "PAUSED", timeout=120, what="the run to ask for approval")
    requests.post(f"{api}/flow_runs/{paused['id']}/set_state", json={
        "state": {"type": "CANCELLING"}, "force": True}, timeout=10).raise_for_status()
    wait_for(lambda: paused_state() == "CANCELLED", timeout=120, what="the run to be cancelled")
    master = SaltMasterClient(lab.salt_master_config)
    assert domain_running(lab, f"store-{store_id}-vm")
    assert master.key_state(f"store-{store_id}-vm") == "accepted"
    # ... and rolled back on request: shown first, done with --yes
    shown = cli_in_process(lab_env, "rollback", store_id, "--inventory", str(inv))
    assert shown.exit_code == 2 and "add --yes to go on" in " ".join(shown.stderr.split())
    assert domain_running(lab, f"store-{store_id}-vm")
    done = cli_in_process(lab_env, "rollback", store_id, "--inventory", str(inv), "--yes")
    assert done.exit_code == 0, (done.exception, done.stderr[-2000:])
    assert json.loads(done.stdout)["authorization"]["approval"].endswith("(confirmed with --yes)")
    assert json.loads(done.stdout)["vm"]["domain"] is True
    assert_rolled_back(lab, store_id)
