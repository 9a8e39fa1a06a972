"""The waits of steps 3 and 6 (tasks/salt/watchers.py) over scripted event streams.

A fake master answers what the watchers ask (grains, keys, running jobs) as functions of a
fake clock, and its bus hands out scripted events at their times: no Salt daemon, no sleep.
Every message asserted here is the text a technician (and the lab tests) read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from store_rollout.contracts import (
    AUTOSIGN_REFUSED_TAG,
    FIRSTBOOT_STAGE_GRAIN,
    HARDWARE_SERIAL_GRAIN,
    HYPERVISOR_READY_GRAIN,
    HYPERVISOR_READY_TAG,
)
from store_rollout.inventory import Store
from tasks.salt import (
    FirstbootFailed,
    FirstbootWatcher,
    HypervisorKeyContested,
    HypervisorMinionRefused,
    HypervisorReadyWatcher,
    HypervisorWrongHardware,
    MinionKeyContested,
    SaltEventTimeout,
    SaltMinionNoResponse,
    SaltTransientError,
    VmNeverContacted,
)
from tasks.salt.masterlog import AuthRefusal

HV, VM = "store-s1-hv", "store-s1-vm"
STORE = Store.model_validate({"store_id": "s1", "erp": {"site_code": "S1"}, "hypervisor": {
    "hostname": "hv.s1.example", "mac": "52:54:00:00:00:01"}})


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ScriptedBus:
    """Salt's MasterEvent as the watchers use it: each event comes at its time; a wait with
    nothing due lets the clock run `wait` seconds."""

    def __init__(self, clock: FakeClock, events: list[tuple[float, str, dict[str, Any]]]) -> None:
        self.clock, self.events = clock, sorted(events, key=lambda e: e[0])

    def get_event(self, wait: float, full: bool) -> dict[str, Any] | None:
        if self.events and self.events[0][0] <= self.clock.now + wait:
            at, tag, data = self.events.pop(0)
            self.clock.now = max(self.clock.now, at)
            return {"tag": tag, "data": data}
        self.clock.now += wait
        return None


class FakeLogTail:
    def __init__(self, clock: FakeClock, refusal_at: float | None) -> None:
        self.clock, self.refusal_at = clock, refusal_at

    def auth_refusals(self, minion_id: str) -> list[AuthRefusal]:
        due = self.refusal_at is not None and self.clock.now >= self.refusal_at
        return [AuthRefusal(minion_id, 2, 3)] if due else []


Answer = Callable[[float], Any]


class FakeMaster:
    """The `MasterApi` of tasks/salt/probes.py. `grain(t)` is the minion's answer to
    grains.get at time t (an exception: it does not answer); `key(t)` its key state."""

    master_config = "/etc/salt/master"

    def __init__(self, clock: FakeClock, events: list[tuple[float, str, dict[str, Any]]], *,
                 grain: Answer, key: Answer = lambda t: "accepted", running: Answer = lambda t: [],
                 denied: bool | str = False, refusal_at: float | None = None,
                 lost_subscriptions: int = 0, serial: str | None = None,
                 job_cache: dict[str, dict[str, Any]] | None = None) -> None:
        self.clock, self.bus = clock, ScriptedBus(clock, events)
        self.grain, self.key, self.running, self.denied = grain, key, running, denied
        self.refusal_at, self.lost, self.serial = refusal_at, lost_subscriptions, serial
        self.calls: list[tuple[str, str, list[Any]]] = []
        self.revoked: list[str] = []
        self.deleted: list[str] = []
        self.subscriptions = 0
        self.job_cache = job_cache or {}  # {jid: what the VM's key returned}

    @contextmanager
    def subscribe(self, prefix: str = "") -> Iterator[ScriptedBus]:
        self.subscriptions += 1
        if self.lost:
            self.lost -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        yield self.bus

    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any:
        self.calls.append((minion_id, fun, list(arg)))
        if fun == "grains.get" and list(arg) == [HARDWARE_SERIAL_GRAIN]:
            return self.serial or ""
        if fun == "grains.get":
            answer = self.grain(self.clock.now)
            if isinstance(answer, BaseException):
                raise answer
            return answer
        if fun == "saltutil.running":
            return self.running(self.clock.now)
        return True

    def cmd_async(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = ()) -> str:
        self.calls.append((minion_id, fun, list(arg)))
        return f"jid-{len(self.calls)}"

    def key_state(self, minion_id: str) -> str | None:
        return self.key(self.clock.now)

    def job_return(self, jid: str, minion_id: str, wait: float = 5) -> dict[str, Any] | None:
        return self.job_cache.get(jid)

    def list_keys(self) -> dict[str, list[str]]:
        key = self.key(self.clock.now)
        denied = self.denied if isinstance(self.denied, str) else HV if self.denied else None
        return {"minions": [HV, VM] if key == "accepted" else [],
                "minions_denied": [denied] if denied else []}

    def fingerprints(self, minion_id: str) -> dict[str, list[str]]:
        return {"minions": ["aa:aa"], "minions_denied": ["bb:bb"]}

    def delete_key(self, minion_id: str) -> bool:
        self.deleted.append(minion_id)
        return True

    def revoke_token(self, minion_id: str) -> bool:
        self.revoked.append(minion_id)
        return True

    def log_tail(self) -> FakeLogTail:
        return FakeLogTail(self.clock, self.refusal_at)

    def funs(self) -> list[str]:
        return [fun for _, fun, _ in self.calls]


def silent(t: float) -> Exception:
    return SaltMinionNoResponse(HV, "grains.get", 5)


def ready_from(when: float) -> Answer:
    """The hypervisor answers from the start; its ready grain is set at `when`."""
    return lambda t: t >= when


def hv_watcher(master: FakeMaster, clock: FakeClock, timeout: float = 900,
               stall_timeout: float = 300, serial: str | None = None) -> HypervisorReadyWatcher:
    return HypervisorReadyWatcher(master, "s1", HV, timeout=timeout, stall_timeout=stall_timeout,
                                  logger=logging.getLogger("test.watchers"), clock=clock,
                                  serial=serial)


# -- step 3 ------------------------------------------------------------------------------------
def test_hypervisor_ready_event_ends_the_wait_and_revokes_the_token() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [(12.0, "salt/minion/other/start", {"id": "other"}),
                                (40.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(40))
    result = hv_watcher(master, clock).wait()
    assert result == {"minion": HV, "waited_seconds": 40.0, "highstate_reapplied": None,
                      "serial": None}
    assert master.revoked == [HV]
    assert ("store-s1-hv", "grains.get", [HYPERVISOR_READY_GRAIN]) in master.calls


def test_a_ready_grain_counts_when_the_event_was_missed(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=ready_from(25))
    caplog.set_level(logging.INFO, "test.watchers")
    result = hv_watcher(master, clock).wait()
    assert result["waited_seconds"] == 30.0  # the grain is checked after each 10 s without event
    assert master.revoked == [HV] and "already ready" not in caplog.text


def test_the_store_box_goes_on_naming_its_serial(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [(5.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(5),
                        serial="LAB525400000001")
    caplog.set_level(logging.INFO, "test.watchers")
    assert hv_watcher(master, clock, serial="lab525400000001").wait()["serial"] == "LAB525400000001"
    assert f"hypervisor {HV} is the store's box (serial LAB525400000001)" in caplog.text


@pytest.mark.parametrize(("reported", "named"), [
    ("LAB525400000009", "reports serial 'LAB525400000009'"),
    (None, "reports no serial (its SMBIOS has none)"),
])
def test_another_box_fails_step_3_naming_both_serials(reported: str | None, named: str) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=silent, serial=reported)
    with pytest.raises(HypervisorWrongHardware) as failed:
        hv_watcher(master, clock, serial="LAB525400000001").wait(already_ready=True)
    assert str(failed.value).startswith(
        f"store s1: hypervisor {HV} {named}, but the inventory's hypervisor.serial is "
        "'LAB525400000001': this is not the store's box. Nothing was done on it after its "
        "install (no VM keys, no VM).")
    assert (failed.value.expected, failed.value.reported) == ("LAB525400000001", reported)
    assert not isinstance(failed.value, SaltTransientError)  # a retry finds the same box
    # the one question asked of the host, after its token was revoked (nothing else done)
    assert master.funs() == ["grains.get"] and master.revoked == [HV]


def test_a_silent_host_leaves_its_serial_to_the_retry() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=silent)
    master.serial = None

    def no_answer(minion_id: str, fun: str, arg: Any = (), **_: Any) -> Any:
        raise SaltMinionNoResponse(HV, fun, 5)

    master.cmd = no_answer  # type: ignore[method-assign]
    with pytest.raises(SaltTransientError):
        hv_watcher(master, clock, serial="LAB525400000001").wait(already_ready=True)


def test_already_ready_makes_no_probe(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=silent)
    caplog.set_level(logging.INFO, "test.watchers")
    assert hv_watcher(master, clock).wait(already_ready=True)["waited_seconds"] == 0
    assert "grains.get" not in master.funs() and master.subscriptions == 0
    assert f"store s1: hypervisor {HV} already ready" in caplog.text


def test_a_stalled_hypervisor_gets_its_highstate_again_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    # up from t=0, not ready; a state run goes on until t=50, then nothing runs
    master = FakeMaster(clock, [(400.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(400),
                        running=lambda t: [{"fun": "state.highstate"}] if t < 50 else [])
    result = hv_watcher(master, clock, stall_timeout=60).wait()
    assert master.funs().count("state.highstate") == 1
    assert result["highstate_reapplied"] == f"jid-{master.funs().index('state.highstate') + 1}"
    assert result["waited_seconds"] == 400.0
    assert (f"store s1: hypervisor {HV} up for 60s but not ready and running no state; "
            f"highstate applied again (job {result['highstate_reapplied']})") in caplog.text


def test_a_silent_hypervisor_is_never_reapplied_and_times_out() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [(5.0, f"salt/minion/{HV}/start", {"id": HV})], grain=silent,
                        key=lambda t: "pending")
    with pytest.raises(SaltEventTimeout) as info:
        hv_watcher(master, clock, timeout=120, stall_timeout=10).wait()
    assert str(info.value) == (
        f"store s1: hypervisor minion {HV} sent no {HYPERVISOR_READY_TAG} within 120s; last "
        f"event from it: salt/minion/{HV}/start; key state: pending")
    assert info.value.minion_id == HV and info.value.timeout == 120
    assert "state.highstate" not in master.funs() and master.revoked == []
    assert 120 <= clock.now < 131


def test_a_refused_auth_protocol_fails_at_the_timeout_naming_why() -> None:
    """The refusal is a hint (anyone can send one): a host that never signs in fails at the
    timeout, with the refusal and its fixes, not as a plain timeout."""
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=silent, refusal_at=35, key=lambda t: None)
    with pytest.raises(HypervisorMinionRefused) as info:
        hv_watcher(master, clock, timeout=120).wait()
    assert str(info.value).startswith(
        f"store s1: the Salt master refuses hypervisor minion {HV}: it signs in with auth "
        "protocol 2, the master requires at least 3 (minimum_auth_version).")
    assert "set `minimum_auth_version: 2` in /etc/salt/master" in str(info.value)
    # the versions that speak protocol 3: upstream's and SUSE's backport (docs/production.md)
    assert ("upstream Salt 3006.12 or later, or SUSE's 3006.0 package from "
            "3006.0-150500.4.55.1" in str(info.value))
    assert info.value.refusal == AuthRefusal(HV, 2, 3) and info.value.minion_id == HV
    assert 120 <= clock.now < 135


def test_a_contested_key_removes_both_and_fails() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=ready_from(0), denied=True)
    with pytest.raises(HypervisorKeyContested) as info:
        hv_watcher(master, clock).wait()
    assert str(info.value).startswith(
        f"store s1: two keys claim hypervisor minion {HV}: accepted aa:aa, denied bb:bb. ")
    assert master.deleted == [HV] and master.revoked == []
    assert info.value.fingerprints == {"minions": ["aa:aa"], "minions_denied": ["bb:bb"]}


def test_a_lost_bus_is_subscribed_again(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [(3.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(3),
                        lost_subscriptions=2)
    assert hv_watcher(master, clock).wait()["waited_seconds"] == 3.0
    assert master.subscriptions == 3
    assert "store s1: event bus lost ([Errno 111] Connection refused); resubscribing" in caplog.text


def test_a_token_used_by_another_machine_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [
        (2.0, AUTOSIGN_REFUSED_TAG, {"id": "intruder", "token_of": HV, "fingerprint": "cc:cc"}),
        (4.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(4))
    hv_watcher(master, clock).wait()
    assert (f"store s1: minion 'intruder' signed in with hypervisor {HV}'s one-time token (key "
            "cc:cc) and was removed by the master's autosign guard") in caplog.text


# -- step 6 ------------------------------------------------------------------------------------
def fb_watcher(master: FakeMaster, clock: FakeClock, timeout: float = 900,
               stall_timeout: float = 300, contact_timeout: float = 600) -> FirstbootWatcher:
    return FirstbootWatcher(master, STORE, timeout=timeout, stall_timeout=stall_timeout,
                            contact_timeout=contact_timeout, master_endpoint=("10.0.0.5", "4506"),
                            logger=logging.getLogger("test.watchers"), clock=clock)


def stage(name: str, at: float, boot_id: str) -> tuple[float, str, dict[str, Any]]:
    return (at, f"store/vm/firstboot/{name}", {"id": VM, "data": {"boot_id": boot_id}})


def vm_grain(stages: list[tuple[float, str]]) -> Answer:
    """The VM's firstboot_stage grain over time: [(from, stage)], silent before the first."""
    def answer(t: float) -> Any:
        now = [s for since, s in stages if t >= since]
        return now[-1] if now else SaltMinionNoResponse(VM, "grains.get", 5)
    return answer


def test_firstboot_follows_the_stages_through_two_reboots() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [
        (8.0, f"salt/minion/{VM}/start", {"id": VM}), stage("started", 10, "b1"),
        (30.0, f"salt/minion/{VM}/start", {"id": VM}), stage("highstate", 35, "b2"),
        stage("report", 60, "b2"), (80.0, f"salt/minion/{VM}/start", {"id": VM}),
        stage("done", 90, "b3")],
        grain=vm_grain([(8, "new"), (30, "highstate"), (80, "verify"), (90, "done")]),
        key=lambda t: "accepted" if t >= 5 else "pending")
    result = fb_watcher(master, clock).wait()
    assert result == {
        "minion": VM, "stages": {"started": 10.0, "highstate": 35.0, "report": 60.0, "done": 90.0},
        "boot_ids": {"started": "b1", "highstate": "b2", "report": "b2", "done": "b3"},
        "minion_starts": [8.0, 30.0, 80.0], "boots_seen": 3, "resets": 0}
    assert master.revoked == [VM]  # once, when its key was first seen accepted
    assert (VM, "grains.get", [FIRSTBOOT_STAGE_GRAIN]) in master.calls


def test_a_vm_already_done_ends_the_wait_at_once() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=lambda t: "done")
    assert fb_watcher(master, clock).wait()["stages"] == {} and clock.now == 0


def test_a_failed_state_run_fails_firstboot_with_its_states() -> None:
    clock = FakeClock()
    ret = {"pkg_|-pos_|-pos_|-installed": {"result": False, "__id__": "pos", "__sls__": "store_vm",
                                           "comment": "no repo", "__run_num__": 3},
           "file_|-motd_|-/etc/motd_|-managed": {"result": True, "__id__": "motd"}}
    master = FakeMaster(clock, [stage("started", 5, "b1"), (40.0, f"salt/job/123/ret/{VM}", {
        "id": VM, "fun": "state.highstate", "retcode": 2, "return": ret})],
        grain=vm_grain([(0, "highstate")]), job_cache={"123": {"return": ret, "retcode": 2}})
    with pytest.raises(FirstbootFailed) as info:
        fb_watcher(master, clock).wait()
    assert str(info.value) == f"store s1: firstboot on {VM} failed: pos: no repo"
    assert info.value.states == [{"id": "pos", "sls": "store_vm", "comment": "no repo"}]


# -- issue 44: events are hints, the minion's own key decides --------------------------------
def test_a_forged_ready_event_is_not_believed(caplog: pytest.LogCaptureFixture) -> None:
    """Another minion fires store/hypervisor/ready with the host's id (a batch event keeps the
    id it is given); the host itself is not ready: the wait goes on, naming the forgery."""
    clock = FakeClock()
    master = FakeMaster(clock, [(5.0, HYPERVISOR_READY_TAG, {"id": HV})], grain=ready_from(60))
    assert hv_watcher(master, clock).wait()["waited_seconds"] >= 60
    assert (f"a {HYPERVISOR_READY_TAG} event claiming to come from {HV} was not confirmed by "
            f"{HV} itself (it answers: answering): another minion forged it") in caplog.text


def test_a_forged_firstboot_done_is_not_believed(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [stage("done", 5, "b1"), stage("done", 70, "b3")],
                        grain=vm_grain([(0, "highstate"), (70, "done")]))
    assert fb_watcher(master, clock).wait()["stages"]["done"] == 70.0
    assert (f"a store/vm/firstboot/done event claiming to come from {VM} was not confirmed by "
            f"{VM} itself (its firstboot stage: highstate): another minion forged it"
            ) in caplog.text


def test_a_forged_failed_state_return_does_not_fail_firstboot(
        caplog: pytest.LogCaptureFixture) -> None:
    """A failed highstate return on the bus that the VM's key never sent (the job cache holds
    its success) is ignored: no one can fail another store's step 6 with it."""
    clock = FakeClock()
    master = FakeMaster(clock, [
        (10.0, f"salt/job/77/ret/{VM}", {"id": VM, "fun": "state.highstate", "retcode": 2,
                                         "return": {}}), stage("done", 40, "b2")],
        grain=vm_grain([(0, "highstate"), (40, "done")]),
        job_cache={"77": {"return": {}, "retcode": 0}})
    assert fb_watcher(master, clock).wait()["stages"]["done"] == 40.0
    assert "is not the one its key sent (the master's job cache: retcode 0)" in caplog.text


def test_a_spoofed_auth_refusal_does_not_fail_step_3(caplog: pytest.LogCaptureFixture) -> None:
    """An auth request with protocol 2 needs no key: anyone on the store network can make the
    master log a refusal for the host's id. It is named, and the host that gets ready wins."""
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=ready_from(100), refusal_at=35)
    assert hv_watcher(master, clock).wait()["waited_seconds"] >= 100
    assert (f"store s1: the master refused a sign-in as {HV} with auth protocol 2 (it requires "
            "3)") in caplog.text


def test_a_vm_that_never_contacts_the_master_fails_after_contact_timeout() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [(3.0, "salt/minion/other-vm/start", {"id": "other-vm"})],
                        grain=vm_grain([]), key=lambda t: None)
    with pytest.raises(VmNeverContacted) as info:
        fb_watcher(master, clock, timeout=900, contact_timeout=60).wait()
    assert str(info.value) == (
        f"store s1: VM minion {VM} never contacted the master within 60s of step 6 (awaited its "
        f"key and its salt/minion/{VM}/start event; neither came). The guest did not boot or "
        "cannot reach the master at 10.0.0.5:4506, the address its image was built with "
        "(image_params SALT_MASTER/SALT_MASTER_PORT): check the VM's console (`virsh console "
        f"{STORE.vm_name}` on {HV}) and its /etc/salt/minion.d/00-master.conf")
    assert info.value.master_address == "10.0.0.5" and info.value.waited == 60
    assert 60 < clock.now <= 66  # not the whole timeout


def test_a_key_alone_counts_as_contact() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [], grain=vm_grain([]), key=lambda t: "pending")
    with pytest.raises(SaltEventTimeout):
        fb_watcher(master, clock, timeout=200, contact_timeout=60).wait()


def test_a_silent_vm_is_reset_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [stage("started", 5, "b1"), stage("done", 500, "b2")],
                        grain=vm_grain([(500, "done")]))  # accepted, answering nothing till done
    result = fb_watcher(master, clock, stall_timeout=100).wait()
    resets = [(m, f, a) for m, f, a in master.calls if f.startswith(("virt.", "storevirt."))]
    assert resets == [(HV, "storevirt.reset", [STORE.vm_name])]
    assert result["resets"] == 1 and result["stages"] == {"started": 5.0, "done": 500.0}
    assert f"store s1: VM minion {VM} silent for 10" in caplog.text  # ~105 s after its last event


def test_a_vm_that_never_finishes_times_out_naming_what_it_saw() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [stage("started", 5, "b1")], grain=vm_grain([(0, "highstate")]))
    with pytest.raises(SaltEventTimeout) as info:
        fb_watcher(master, clock, timeout=100, stall_timeout=30).wait()
    assert str(info.value) == (
        f"store s1: VM minion {VM} did not finish firstboot within 100s; stages seen: "
        "['started']; last event from it: store/vm/firstboot/started; resets: 0")
    assert "storevirt.reset" not in master.funs()  # it answered: not hung


def test_an_event_from_the_vm_counts_as_contact() -> None:
    clock = FakeClock()
    master = FakeMaster(clock, [stage("started", 10, "b1")], grain=vm_grain([]), key=lambda t: None)
    with pytest.raises(SaltEventTimeout):  # the whole timeout: it did show up once
        fb_watcher(master, clock, timeout=200, contact_timeout=60).wait()


def test_a_vm_that_keeps_sending_events_is_not_reset() -> None:
    clock = FakeClock()
    busy = [(float(t), f"salt/job/{t}/ret/{VM}", {"id": VM, "fun": "test.ping", "retcode": 0})
            for t in range(50, 500, 50)]
    master = FakeMaster(clock, [*busy, stage("done", 520, "b2")],
                        grain=vm_grain([(520, "done")]))
    assert fb_watcher(master, clock, stall_timeout=100).wait()["resets"] == 0
    assert "storevirt.reset" not in master.funs()


def test_a_second_key_for_the_vms_id_fails_firstboot_naming_both() -> None:
    """Issue 44: an intruder accepted as the VM's id (its token read from the publication of
    step 5) while the real VM's key sits denied: step 6 fails, both keys removed, nothing is
    believed of either."""
    clock = FakeClock()
    master = FakeMaster(clock, [stage("done", 5, "b1")], grain=vm_grain([(0, "done")]),
                        denied=VM)
    with pytest.raises(MinionKeyContested) as info:
        fb_watcher(master, clock).wait()
    assert str(info.value).startswith(
        f"store s1: two keys claim VM minion {VM}: accepted aa:aa, denied bb:bb. ")
    assert "rerun the rollout asking for recreate_vm" in str(info.value)
    assert master.deleted == [VM] and master.revoked == []
