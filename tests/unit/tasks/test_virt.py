"""tasks.store_vm's start loop (start_domain): its tenacity loop is the one retry layer of
virt.start (docs/reliability.md, "Retries and timeouts"), against a scripted Salt master;
what the loop does not retry is left to the task's Prefect retries."""

from __future__ import annotations

from typing import Any

import pytest

from store_rollout.inventory import parse_inventory
from tasks.salt import SaltCommandFailed, SaltMinionNoResponse
from tasks.store_vm import VmError, VmNotRunning, start_domain

STORE = parse_inventory({"stores": [{
    "store_id": "0042", "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01"},
    "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
    "erp": {"site_code": "DE-0042"}}]}).stores[0]

class ScriptedMaster:
    """A Salt master stand-in for start_domain: virt.start answers from `starts` in turn
    ("refuse", "silent" or "ok"); the domain is active once a start succeeded, gone when
    `gone`."""

    def __init__(self, starts: list[str], gone: bool = False) -> None:
        self.starts = list(starts)
        self.running = False
        self.gone = gone
        self.calls: list[str] = []

    def cmd(self, minion_id: str, fun: str, arg: list[Any], **_kw: Any) -> Any:
        self.calls.append(fun)
        if fun == "storevirt.domain_summary":
            return None if self.gone else {"name": arg[0], "active": self.running}
        outcome = self.starts.pop(0)
        if outcome == "refuse":
            raise SaltCommandFailed(minion_id, fun, 1, "internal error: hook refused the start")
        if outcome == "silent":
            raise SaltMinionNoResponse(minion_id, fun, 60)
        self.running = True
        return True


def test_virt_start_refusals_are_retried_by_the_tenacity_loop() -> None:
    master = ScriptedMaster(["refuse", "refuse", "ok"])
    start_domain(master, STORE, timeout=10, backoff=0)  # type: ignore[arg-type]
    assert master.calls.count("virt.start") == 3 and master.running


def test_virt_start_loop_gives_up_after_its_timeout() -> None:
    master = ScriptedMaster(["refuse"] * 1000)
    with pytest.raises(VmNotRunning, match="hook refused"):
        start_domain(master, STORE, timeout=0.2, backoff=0.01)  # type: ignore[arg-type]
    assert master.calls.count("virt.start") >= 2


def test_a_silent_minion_is_left_to_the_tasks_prefect_retries() -> None:
    master = ScriptedMaster(["silent", "ok"])
    with pytest.raises(SaltMinionNoResponse):
        start_domain(master, STORE, timeout=10, backoff=0)  # type: ignore[arg-type]
    assert master.calls.count("virt.start") == 1


def test_the_start_loop_reads_its_domain_by_name_and_stops_when_it_is_gone() -> None:
    """virt.vm_state enumerates every domain of the host, and failed when another store's
    domain went away meanwhile (a 100-run burst): the loop reads its own domain by name."""
    master = ScriptedMaster(["ok"])
    start_domain(master, STORE, timeout=10, backoff=0)  # type: ignore[arg-type]
    assert "virt.vm_state" not in master.calls
    with pytest.raises(VmError, match="is gone from"):
        start_domain(ScriptedMaster(["ok"], gone=True), STORE, timeout=10,  # type: ignore[arg-type]
                     backoff=0)
