"""Issue 43: a live store's host that does not answer (a WAN cut looks like a stopped
salt-minion: SIGSTOP) is silent, not "not installed": a rerun powers nothing, changes nothing
in Cobbler and fails naming the silence; `plan` shows it silent with nothing destructive; once
the minion answers again, a rerun completes with nothing redone."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from lab.state import LabInfo, LabPaths
from tasks.cobbler import CobblerClient
from tests.helpers import check_store, cli_in_process, finish, power_actions, start_rollout, write_inventory

pytestmark = pytest.mark.lab


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


def test_a_silent_live_host_is_waited_for_never_reinstalled(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], tmp_path: Path) -> None:
    store_id = "ls-silent"
    hv = f"store-{store_id}-hv"
    inventory = write_inventory(tmp_path / "inv.yaml", [store_id], "52:54:00:51:1e", lab=lab)
    first = finish(start_rollout(lab_env, store_id, inventory))
    check_store(lab, store_id, first)
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
        proc = start_rollout(lab_env, store_id, inventory, "--hypervisor-timeout", "15")
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
