"""Offline-first runs (tasks/store_link.py): the decision (bound, messages) as pure functions, and
the wait over a fake master whose store is cut off for a while (a fake clock: no sleep).

The master is step 6's FakeMaster (tests/unit/tasks/test_salt_watchers.py) with a cut: while it
lasts every call to the store's minions goes unanswered (after the probe's 5 + 2 s) and the
store's events never reach the bus. The real lab's cut: tests/lab/test_offline_first.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from store_rollout.contracts import FIRSTBOOT_STAGE_GRAIN
from store_rollout.settings import RolloutSettings
from store_rollout.settings_link import DEFAULT_STORE_LINK_WAIT_SECONDS
from store_rollout.settings_parts import SaltSettings
from tasks.go_live import GoLiveGate
from tasks.salt import SaltEventTimeout, SaltMinionNoResponse
from tasks.salt.errors import VmNeverContacted
from tasks.store_link import (
    LINK_DOWN,
    LinkedCalls,
    StoreLink,
    StoreLinkLost,
    link_down_message,
    past_bound,
    silence_failure,
)
from tests.unit.tasks.test_salt_watchers import (
    HV,
    STORE,
    VM,
    FakeClock,
    FakeMaster,
    fb_watcher,
    stage,
    vm_grain,
)

EPOCH = datetime(2026, 11, 28, 8, 0, 0, tzinfo=UTC)


class CutMaster(FakeMaster):
    """FakeMaster whose store is cut off from `cut[0]` to `cut[1]` (seconds of the fake clock):
    a call to its minions meanwhile is not answered; its events meanwhile are lost."""

    def __init__(self, clock: FakeClock, events: list[tuple[float, str, dict[str, Any]]],
                 cut: tuple[float, float], **kwargs: Any) -> None:
        super().__init__(clock, [e for e in events if not cut[0] <= e[0] < cut[1]], **kwargs)
        self.cut = cut

    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any:
        if self.cut[0] <= self.clock.now < self.cut[1]:
            self.calls.append((minion_id, fun, list(arg)))
            self.clock.now += min(timeout, 5) + (gather_job_timeout or 0)
            raise SaltMinionNoResponse(minion_id, fun, timeout)
        return super().cmd(minion_id, fun, arg, kwarg, timeout, gather_job_timeout)


class Said:
    """What the run's state said (name, message), in order."""

    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []

    def __call__(self, name: str, message: str) -> None:
        self.states.append((name, message))


def link_of(master: FakeMaster, clock: FakeClock, said: Said, bound: float = 600) -> StoreLink:
    return StoreLink(master, STORE, bound, clock=clock.monotonic, sleep=clock.sleep, say=said,
                     wall=lambda: EPOCH + timedelta(seconds=clock.now))


# -- the decision --------------------------------------------------------------------------------
def test_the_messages_name_the_store_the_silence_and_the_setting() -> None:
    since = datetime(2026, 11, 28, 9, 30, 5, 123, tzinfo=UTC)
    assert link_down_message("0042", since) == "store 0042 link down since 2026-11-28 09:30:05 UTC"
    line = silence_failure("0042", ["store-0042-hv", "store-0042-vm"], since, 3600)
    assert line == (
        "store 0042: its minions store-0042-hv, store-0042-vm have been silent since "
        "2026-11-28 09:30:05 UTC, longer than store_link_wait_seconds (3600 s): the store's "
        "link is still down (or its power); raise STORE_ROLLOUT_STORE_LINK_WAIT_SECONDS to wait "
        "longer, then run the store again: it resumes where it stopped, nothing was undone")
    assert "\n" not in line


def test_the_bound_counts_the_whole_silence() -> None:
    assert not past_bound(3599.9, 3600) and past_bound(3600, 3600) and past_bound(4000, 3600)


def test_the_setting_defaults_to_an_hour_is_validated_and_reaches_steps_6_and_7(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEFAULT_STORE_LINK_WAIT_SECONDS == 3600
    assert RolloutSettings.model_fields["store_link_wait_seconds"].default == 3600
    base = {"salt_master_config": "/etc/salt/master", "salt_master_address": "10.0.0.5",
            "cobbler_url": "http://127.0.0.1:25151/", "cobbler_user": "u",
            "cobbler_password_block": "b", "erp_url": "http://127.0.0.1:1/", "erp_token_block": "t",
            "image_base_url": "http://127.0.0.1:2/"}
    settings = RolloutSettings(**base, store_link_wait_seconds=600)
    assert SaltSettings.of(settings).store_link_wait_seconds == 600
    with pytest.raises(ValueError, match="store_link_wait_seconds"):
        RolloutSettings(**base, store_link_wait_seconds=0)


# -- the wait --------------------------------------------------------------------------------------
def test_a_store_that_answers_costs_one_ping_and_says_nothing() -> None:
    clock, said = FakeClock(), Said()
    master = CutMaster(clock, [], cut=(100, 200), grain=lambda t: "done")
    assert link_of(master, clock, said).hold() == 0 and said.states == []
    assert master.calls == [(HV, "test.ping", [])]


def test_a_cut_store_is_waited_for_said_and_goes_on_when_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, said = FakeClock(), Said()
    clock.now = 100
    master = CutMaster(clock, [], cut=(100, 220), grain=lambda t: "done")
    link = link_of(master, clock, said)
    waited = link.hold(silent_for=20)
    assert 120 <= waited <= 120 + 24  # back at 220, seen within a round (2 probes, 10 s apart)
    assert said.states[0] == (LINK_DOWN, "store s1 link down since 2026-11-28 08:01:20 UTC")
    assert said.states[-1][0] == "Running" and "link back at 2026-11-28 08:03:" in said.states[-1][1]
    assert "store s1 link down since 2026-11-28 08:01:20 UTC" in caplog.text
    assert link.outages == [{"since": "2026-11-28 08:01:20 UTC", "seconds": round(20 + waited, 1)}]
    # only pings while it waited: nothing reset, reinstalled or deleted because it was silent
    assert {fun for _, fun, _ in master.calls} == {"test.ping"} and master.deleted == []


def test_past_the_bound_the_run_fails_with_one_line_naming_the_silence() -> None:
    clock, said = FakeClock(), Said()
    master = CutMaster(clock, [], cut=(0, 10_000), grain=lambda t: "done")
    with pytest.raises(StoreLinkLost) as info:
        link_of(master, clock, said, bound=300).hold(silent_for=30)
    assert str(info.value) == silence_failure("s1", [HV, VM], EPOCH - timedelta(seconds=30), 300)
    assert 270 <= clock.now <= 270 + 24  # at the bound (30 s silent before), not later
    assert said.states == [(LINK_DOWN, "store s1 link down since 2026-11-28 07:59:30 UTC")]


def test_a_call_lost_to_the_cut_is_asked_again_once_the_store_answers() -> None:
    clock, said = FakeClock(), Said()
    master = CutMaster(clock, [], cut=(0, 90), grain=lambda t: "done")
    calls = LinkedCalls(master, link_of(master, clock, said))
    assert calls.cmd(VM, "storegate.run", ["/etc/store/config.json", 1.0]) is True
    assert [c for c in master.calls if c[1] == "storegate.run"][-1] == (
        VM, "storegate.run", ["/etc/store/config.json", 1.0])
    assert len([c for c in master.calls if c[1] == "storegate.run"]) == 2  # lost, then again
    assert said.states[0][0] == LINK_DOWN and said.states[-1][0] == "Running"


def test_a_vm_alone_silent_is_no_link_down_the_call_fails_as_before() -> None:
    clock, said = FakeClock(), Said()

    class VmSilent(FakeMaster):
        def cmd(self, minion_id: str, fun: str, *args: Any, **kwargs: Any) -> Any:
            if minion_id == VM:
                raise SaltMinionNoResponse(VM, fun, 60)
            return super().cmd(minion_id, fun, *args, **kwargs)

    master = VmSilent(clock, [], grain=lambda t: "done")
    with pytest.raises(SaltMinionNoResponse):
        LinkedCalls(master, link_of(master, clock, said)).cmd(VM, "storegate.run")
    assert said.states == []


def test_the_go_live_gate_rides_out_a_cut() -> None:
    clock, said = FakeClock(), Said()
    rows = [{"check": "store-pos running", "kind": "service", "passed": True,
             "observed": "active", "expected": "active"}]

    class Gate(CutMaster):
        def cmd(self, minion_id: str, fun: str, *args: Any, **kwargs: Any) -> Any:
            answer = super().cmd(minion_id, fun, *args, **kwargs)
            return rows if fun == "storegate.run" else answer

    master = Gate(clock, [], cut=(0, 75), grain=lambda t: "done")
    gate = GoLiveGate(LinkedCalls(master, link_of(master, clock, said)), STORE, 0,
                      clock=clock.monotonic, sleep=clock.sleep)
    assert gate.check().passed and clock.now >= 75
    assert said.states[0][0] == LINK_DOWN


# -- step 6's wait ---------------------------------------------------------------------------------
def test_firstboot_waits_out_a_cut_and_finds_it_done_without_resetting_the_vm() -> None:
    """The store is cut from 40 s to 400 s; its VM finished firstboot at 150 s (the done event
    was lost). Without the link's wait, the silent VM was reset (stall_timeout 100 s) and the
    step timed out (300 s); with it, the run waits, then reads the VM's stage: done."""
    clock, said = FakeClock(), Said()
    events = [stage("started", 10, "b1"), stage("highstate", 30, "b2"), stage("done", 150, "b3")]
    grain = vm_grain([(10, "new"), (30, "highstate"), (150, "done")])
    master = CutMaster(clock, events, cut=(40, 400), grain=grain)
    watcher = fb_watcher(master, clock, timeout=300, stall_timeout=100)
    watcher.link = link_of(master, clock, said).hold
    result = watcher.wait()
    assert result["resets"] == 0 and "storevirt.reset" not in master.funs()
    assert result["stages"] == {"started": 10.0, "highstate": 30.0}  # done read from the grain
    assert clock.now >= 400 and said.states[0] == (
        LINK_DOWN, "store s1 link down since 2026-11-28 08:00:30 UTC")  # its last event
    assert (VM, "grains.get", [FIRSTBOOT_STAGE_GRAIN]) in master.calls


def test_without_the_link_wait_the_same_cut_resets_the_vm_and_times_out() -> None:
    """The same store and cut, without the link wait (the code before issue 49)."""
    clock = FakeClock()
    events = [stage("started", 10, "b1"), stage("highstate", 30, "b2"), stage("done", 150, "b3")]
    grain = vm_grain([(10, "new"), (30, "highstate"), (150, "done")])
    master = CutMaster(clock, events, cut=(40, 400), grain=grain)
    with pytest.raises((SaltEventTimeout, SaltMinionNoResponse)):
        fb_watcher(master, clock, timeout=300, stall_timeout=100).wait()
    assert "storevirt.reset" in master.funs()  # silence taken for a hung VM


def test_a_vm_rebooting_while_its_hypervisor_answers_is_not_a_link_down() -> None:
    clock, said = FakeClock(), Said()
    master = FakeMaster(clock, [stage("started", 5, "b1"), stage("done", 80, "b2")],
                        grain=vm_grain([(80, "done")]))
    watcher = fb_watcher(master, clock)
    watcher.link = link_of(master, clock, said).hold
    assert watcher.wait()["stages"] == {"started": 5.0, "done": 80.0}
    assert said.states == []
    pings = [c for c in master.calls if c[1] == "test.ping"]
    assert pings and all(m == HV for m, _, _ in pings) and len(pings) <= 80 // 15 + 1


def test_the_bound_is_the_runs_over_all_its_outages_not_each_ones() -> None:
    """A line that answers once per bound and drops again must not keep a run waiting for ever
    (review): the outages add up, and past the bound the run fails."""
    clock, said = FakeClock(), Said()

    class Flapping(FakeMaster):
        def cmd(self, minion_id: str, fun: str, arg: Any = (), kwarg: Any = None,
                timeout: float = 60, gather_job_timeout: float | None = None) -> Any:
            clock.now += 1
            if clock.now % 500 < 480:  # down 480 s, then up 20 s, over and over
                raise SaltMinionNoResponse(minion_id, fun, timeout)
            return True

    link = link_of(Flapping(clock, [], grain=lambda t: "done"), clock, said, bound=600)
    with pytest.raises(StoreLinkLost):
        for _ in range(100):
            link.hold()
    assert link.waited_before() <= 600 and clock.now < 3 * 600, (link.outages, clock.now)


def test_a_cut_since_the_last_link_check_is_waited_for_before_a_reset() -> None:
    """The stall check runs between link checks (every 15 s): a store cut off just after one
    was taken for a hung VM and reset through a host it could not reach (review). Now the link
    is asked right before the reset: the cut is waited out, and nothing is reset."""
    clock, said = FakeClock(), Said()
    master = CutMaster(clock, [], cut=(100, 300), grain=vm_grain([(10, "highstate")]))
    watcher = fb_watcher(master, clock, timeout=3600, stall_timeout=60)
    watcher.link = link_of(master, clock, said).hold
    clock.now = 101
    watcher.last_seen, watcher.link_checked = 20.0, 100.0  # silent 81 s; link asked 1 s ago
    watcher._reset_if_stalled()
    assert watcher.resets == 0 and "storevirt.reset" not in master.funs()
    assert clock.now >= 300 and said.states[0][0] == LINK_DOWN and watcher.link_waited > 0


def test_a_cut_since_the_last_link_check_is_no_vm_that_never_called() -> None:
    clock, said = FakeClock(), Said()
    master = CutMaster(clock, [], cut=(100, 300), grain=vm_grain([]),
                       key=lambda t: None)  # the VM's key not there yet
    watcher = fb_watcher(master, clock, timeout=3600, contact_timeout=60)
    watcher.link = link_of(master, clock, said).hold
    clock.now, watcher.link_checked = 101, 100.0
    watcher._fail_if_never_contacted(False)  # no VmNeverContacted: the store was cut off
    assert clock.now >= 300 and said.states[0][0] == LINK_DOWN
    # and once the link is back the VM has a whole contact_timeout to call, not a few seconds
    clock.now += 30
    watcher._fail_if_never_contacted(False)
    clock.now += 40
    with pytest.raises(VmNeverContacted):
        watcher._fail_if_never_contacted(False)
