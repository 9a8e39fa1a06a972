"""Issue 5: cancelling a rollout (run by the lab's worker) through the API cleans up a store
that never went live. Issue 43, on the same store once it is live: its host's minion stopped
as a WAN cut leaves it (SIGSTOP) is silent, not "not installed" (a rerun powers nothing,
changes nothing in Cobbler and fails naming the silence; `plan` shows it silent, nothing
destructive; thawed, a rerun completes with nothing redone); cancelling a run of the live store
paused for its approval leaves the store as it is; `store-rollout rollback` shows what it would
do and goes on with `--yes`."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from lab.approvers import code_args
from lab.faults import clear_fault
from lab.prefect_access import api_session
from lab.state import LabInfo, LabPaths
from store_rollout.contracts import DATA_DISK_FILE
from tasks.cobbler import CobblerClient
from tasks.salt import SaltMasterClient
from tests.helpers import (
    check_store,
    cli_in_process,
    created_erp_notices,
    finish,
    power_actions,
    start_rollout,
    wait_for,
    write_inventory,
)

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


def vm_files(lab: LabInfo, store_id: str) -> set[str]:
    """The files left of the store VM on its host (its images dir)."""
    vm_dir = Path(lab.vm_images_dir) / f"store-{store_id}-vm"
    return {p.name for p in vm_dir.iterdir()} if vm_dir.is_dir() else set()


def rolled_back(lab: LabInfo, store_id: str) -> bool:
    """The rollback's last traces gone: domain, system disk and key (assert_rolled_back says
    which one is left); the data disk stays (only a decommission removes it)."""
    vm = f"store-{store_id}-vm"
    return (vm not in domains(lab) and vm_files(lab, store_id) <= {DATA_DISK_FILE}
            and SaltMasterClient(lab.salt_master_config).key_state(vm) is None)


def assert_rolled_back(lab: LabInfo, store_id: str) -> None:
    vm = f"store-{store_id}-vm"
    assert vm not in domains(lab)
    # system disk and seed removed, the data disk kept on the host (issue 47)
    assert vm_files(lab, store_id) == {DATA_DISK_FILE}
    master = SaltMasterClient(lab.salt_master_config)
    assert master.key_state(vm) is None and master.token_for(vm) is None
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    system = cobbler.get_system(f"store-{store_id}-hv")
    assert system is None or system["netboot_enabled"] is False


def held_before_live(faults: Callable[[str, dict[str, Any]], None], store_id: str) -> None:
    """The store's VM does not come back from its first reboot (step 6): its run waits there
    and the store never goes live, so a cancel sent once the VM runs finds a store that never
    went live, however fast the machine (here steps 6 and 7 took 15 s: as long as a cancel
    clicked through the UI, which then found a live store and rightly left it)."""
    faults(f"reboot@store-{store_id}-vm", {"fail": 1})


def assert_never_live(lab: LabInfo, store_id: str) -> None:
    """The ERP never heard of the store: a cancel's clean-up may remove its VM."""
    assert created_erp_notices(lab, store_id) == [], f"store {store_id} went live before its cancel"


def minion_processes(lab_dir: Path, minion: str) -> list[psutil.Process]:
    """The salt-minion processes of a simulated machine (its config dir is in their argv)."""
    etc = str(LabPaths(lab_dir).simulator / "minions" / minion / "etc")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if etc in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


@contextmanager
def frozen(lab_dir: Path, minion: str) -> Iterator[None]:
    """The minion stopped as a cut link leaves it: alive, silent; thawed at the end whatever
    happened."""
    procs = minion_processes(lab_dir, minion)
    assert procs, f"no salt-minion process of {minion}"
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            if proc.is_running():
                os.kill(proc.pid, signal.SIGCONT)


def check_a_silent_live_host_is_waited_for(lab: LabInfo, lab_dir: Path,
                                           lab_env: dict[str, str], inventory: Path,
                                           store_id: str, first: dict[str, Any]) -> None:
    hv = f"store-{store_id}-hv"
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    record_before = cobbler.get_system(hv)
    power_before = power_actions(lab, hv)
    with frozen(lab_dir, hv):
        plan = cli_in_process(lab_env, "plan", store_id, "--inventory", str(inventory), "--json")
        assert plan.exit_code == 0, plan.stderr[-2000:]
        planned = json.loads(plan.stdout)[store_id]
        pxe = next(s for s in planned["steps"] if s["step"] == "pxe_install_hypervisor")
        assert pxe["action"] == "none: hypervisor installed, silent", pxe
        assert planned["destructive"] == [], planned
        proc = start_rollout(lab_env, store_id, inventory, "--hypervisor-timeout", "6")
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (out[-2000:], err[-2000:])
    rerun = json.loads(out)
    assert rerun["state"] == "Failed", rerun
    assert "silent for" in rerun["error"] and hv in rerun["error"], rerun["error"]
    assert "never reinstalled" in rerun["error"], rerun["error"]
    # no power action, no change in Cobbler (its record as it was: netboot off, same meta)
    assert power_actions(lab, hv) == power_before
    assert cobbler.get_system(hv) == record_before
    # the link back: a rerun completes with nothing redone
    again = finish(start_rollout(lab_env, store_id, inventory))
    assert again["hypervisor_reinstalled"] is False and again["hypervisor_power_actions"] == []
    assert again["vm"]["reused"] is True and again["erp_id"] == first["erp_id"], again
    assert power_actions(lab, hv) == power_before


def test_cancel_silence_and_rollback_of_one_store(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], faults: Any,
        tmp_path: Path) -> None:
    store_id = "c-cancel"
    inv = write_inventory(tmp_path / "inv.yaml", [store_id], "52:54:00:cc:00", lab=lab)
    held_before_live(faults, store_id)
    api = lab.prefect_api_url
    def deployment_id() -> str | None:
        resp = api_session(api).get(f"{api}/deployments/name/store-rollout/store-rollout", timeout=5)
        return resp.json()["id"] if resp.status_code == 200 else None

    wait_for(lambda: deployment_id() is not None, timeout=90,
             what="the lab's store-rollout deployment")
    run = api_session(api).post(f"{api}/deployments/{deployment_id()}/create_flow_run", json={
        "parameters": {"store_id": store_id, "inventory": str(inv)}}, timeout=10).json()
    # cancelled once its VM runs: the rerun below then needs a fresh disk for the new domain
    wait_for(lambda: domain_running(lab, f"store-{store_id}-vm"), timeout=300,
             what="step 5 (VM running)")
    api_session(api).post(f"{api}/flow_runs/{run['id']}/set_state", json={
        "state": {"type": "CANCELLING"}, "force": True}, timeout=10).raise_for_status()

    def run_state() -> str:
        return str(api_session(api).get(f"{api}/flow_runs/{run['id']}", timeout=5).json()["state_type"])

    wait_for(lambda: run_state() == "CANCELLED", timeout=120, what="the run to be cancelled")
    assert_never_live(lab, store_id)
    wait_for(lambda: rolled_back(lab, store_id), timeout=120, what="the rollback")
    assert_rolled_back(lab, store_id)
    # the hold is spent, or never used when the cancel came before the reboot: the rerun's VM
    # comes back from its reboots
    clear_fault(lab, f"reboot@store-{store_id}-vm")

    # a cancelled rollout can be retried from scratch ...
    result = finish(start_rollout(lab_env, store_id, inv))
    check_store(lab, store_id, result)
    # ... once live, its host silent is waited for, never reinstalled
    check_a_silent_live_host_is_waited_for(lab, lab_dir, lab_env, inv, store_id, result)
    # ... a run of the live store that would recreate its VM waits for its approval; cancelled
    # there, it leaves the live store as it is (issue 43: cancel is not rollback)
    paused = api_session(api).post(f"{api}/deployments/{deployment_id()}/create_flow_run", json={
        "parameters": {"store_id": store_id, "inventory": str(inv), "recreate_vm": True}},
        timeout=10).json()

    def paused_state() -> str:
        return str(api_session(api).get(f"{api}/flow_runs/{paused['id']}", timeout=5).json()["state_type"])

    wait_for(lambda: paused_state() == "PAUSED", timeout=120, what="the run to ask for approval")
    api_session(api).post(f"{api}/flow_runs/{paused['id']}/set_state", json={
        "state": {"type": "CANCELLING"}, "force": True}, timeout=10).raise_for_status()
    wait_for(lambda: paused_state() == "CANCELLED", timeout=120, what="the run to be cancelled")
    master = SaltMasterClient(lab.salt_master_config)
    assert domain_running(lab, f"store-{store_id}-vm")
    assert master.key_state(f"store-{store_id}-vm") == "accepted"
    # ... and rolled back on request: shown first, done with --yes
    shown = cli_in_process(lab_env, "rollback", store_id, "--inventory", str(inv))
    assert shown.exit_code == 2 and "add --yes to go on" in " ".join(shown.stderr.split())
    assert domain_running(lab, f"store-{store_id}-vm")
    # issue 44: --yes needs an approver proven by a one-time code; a wrong one is refused
    # before the run starts (and the run would refuse it again itself)
    wrong = cli_in_process(lab_env, "rollback", store_id, "--inventory", str(inv), "--yes",
                           "--approver", "ana", "--code", "000000")
    assert wrong.exit_code == 2 and "--code: code wrong for 'ana'" in " ".join(
        wrong.stderr.split()), wrong.stderr[-2000:]
    assert domain_running(lab, f"store-{store_id}-vm")
    done = cli_in_process(lab_env, "rollback", store_id, "--inventory", str(inv), "--yes",
                          *code_args(lab))
    assert done.exit_code == 0, (done.exception, done.stderr[-2000:])
    assert json.loads(done.stdout)["authorization"]["approval"] == (
        "approved by ana (one-time code checked, confirmed with --yes)")
    assert json.loads(done.stdout)["vm"]["domain"] is True
    kept = json.loads(done.stdout)["vm"]["data_disk"]
    assert kept["kept"] is True and kept["path"] == str(
        Path(lab.vm_images_dir) / f"store-{store_id}-vm" / DATA_DISK_FILE), kept
    assert "is kept (only a decommission removes it)" in kept["said"], kept
    assert_rolled_back(lab, store_id)
