"""SaltMasterClient maps what Salt's LocalClient, WheelClient and event bus do to the SaltError
tree. Fakes stand in for Salt's clients, passed to the constructor as factories; the
exceptions they raise are Salt's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from salt.exceptions import (
    AuthorizationError,
    SaltClientError,
    SaltClientTimeout,
    SaltReqTimeoutError,
)

from tasks.salt import (
    SaltCommandFailed,
    SaltError,
    SaltEventTimeout,
    SaltMasterClient,
    SaltMasterUnavailable,
    SaltMinionNoResponse,
    SaltTransientError,
)

CONFIG = "/nonexistent/master"  # never read: the fakes replace everything built from it


class FakeClient:
    """Stands in for LocalClient / WheelClient: answers (or raises) `answers` in turn. As a
    LocalClient, an answer is what the bus shows ({minion: {ret, retcode}}) and, unless `cache`
    says otherwise, what the master's job cache holds too."""

    opts = {"job_cache": True, "master_job_cache": "local_cache"}

    def __init__(self, *answers: Any, cache: dict[str, Any] | None = None) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[Any, ...]] = []
        self.options: list[dict[str, Any]] = []  # the job's keyword arguments, call by call
        self.destroyed = False
        self.cache = cache
        self.on_bus: dict[str, Any] = {}
        self.event = SimpleNamespace(cpub=True, close_pub=lambda: None)
        self.returners = {"local_cache.get_jid": self._cached}

    def _next(self, *call: Any) -> Any:
        self.calls.append(call)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def cmd(self, *args: Any, **kwargs: Any) -> Any:
        self.options.append(kwargs)
        return self._next(*args)

    def run_job(self, tgt: Any, fun: Any, arg: Any, tgt_type: str = "glob", ret: str = "",
                timeout: Any = None, jid: str = "", kwarg: Any = None, listen: bool = False,
                **kwargs: Any) -> dict[str, Any]:
        self.options.append({"timeout": timeout, **kwargs})
        self.on_bus = self._next(tgt, fun, arg)
        return {"jid": "20261127170000000000", "minions": list(self.on_bus) or [tgt]}

    def get_cli_event_returns(self, jid: str, minions: list[str], *args: Any,
                              **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield from ({minion: data} for minion, data in self.on_bus.items())

    def _cached(self, jid: str) -> dict[str, Any]:
        if self.cache is not None:
            return self.cache
        return {minion: {"return": data["ret"], "retcode": data.get("retcode", 0)}
                for minion, data in self.on_bus.items()}

    def cmd_async(self, *args: Any) -> Any:
        return self._next(*args)

    def destroy(self) -> None:
        self.destroyed = True


def master_with(*clients: FakeClient, wheel: bool = False) -> SaltMasterClient:
    """A client whose LocalClient (or WheelClient) builds are `clients`, in turn."""
    pending = list(clients)
    factory = {"wheel_client" if wheel else "local_client": lambda: pending.pop(0)}
    return SaltMasterClient(CONFIG, **factory)


def test_a_return() -> None:
    local = FakeClient({"hv": {"ret": True, "retcode": 0}})
    assert master_with(local).cmd("hv", "test.ping", timeout=3) is True
    assert local.calls == [("hv", "test.ping", [])]


def test_the_masters_follow_up_to_a_silent_minion_is_shortened_only_when_asked() -> None:
    local = FakeClient(*[{"hv": {"ret": "new", "retcode": 0}}] * 2)
    master = master_with(local)
    master.cmd("hv", "grains.get", ["firstboot_stage"], timeout=5, gather_job_timeout=2)
    master.cmd("hv", "virt.init", ["vm"], timeout=180)
    assert [o.get("gather_job_timeout") for o in local.options] == [2, None]
    assert "gather_job_timeout" not in local.options[1]  # the master's config decides


def test_probes_of_a_down_minion_ask_briefly() -> None:
    from tasks.salt.probes import firstboot_stage, hypervisor_state

    first, second = FakeClient({}), FakeClient({})  # neither minion answers (a client each:
    master = master_with(first, second)             # a silent minion renews the connection)
    assert hypervisor_state(master, "hv") == "silent"
    assert firstboot_stage(master, "vm") is None
    # 5 s and a 2-s follow-up each, not the master's 10 s
    assert [(o["timeout"], o["gather_job_timeout"]) for o in first.options + second.options] \
        == [(5, 2), (5, 2)]


def test_a_compound_job_answers_each_function_or_its_failure() -> None:
    local = FakeClient({"hv": {"ret": {"storevirt.domain_summary": None,
                                       "storevirt.extension_hashes": "Traceback ... not available"},
                               "retcode": {"storevirt.domain_summary": 0}}})
    answers = master_with(local).cmd_multi("hv", [("storevirt.extension_hashes", [["modules"]]),
                                                  ("storevirt.domain_summary", ["vm"])])
    assert local.calls == [("hv", ["storevirt.extension_hashes", "storevirt.domain_summary"],
                            [[["modules"]], ["vm"]])]
    assert answers["storevirt.domain_summary"] is None
    failed = answers["storevirt.extension_hashes"]
    assert isinstance(failed, SaltCommandFailed) and failed.fun == "storevirt.extension_hashes"
    assert "not available" in str(failed)


def test_a_minion_that_does_not_return_is_transient_and_renews_the_connection() -> None:
    first, second = FakeClient({}), FakeClient({"hv": {"ret": "done", "retcode": 0}})
    master = master_with(first, second)
    with pytest.raises(SaltMinionNoResponse, match="^minion 'hv' did not answer grains.get "
                                                   "within 5s$") as info:
        master.cmd("hv", "grains.get", ["x"], timeout=5)
    assert isinstance(info.value, SaltTransientError) and info.value.minion_id == "hv"
    assert first.destroyed
    assert master.cmd("hv", "grains.get", ["x"]) == "done"  # a new LocalClient


@pytest.mark.parametrize("exc", [
    SaltClientError("The salt master could not be contacted. Is master running?"),
    SaltReqTimeoutError("Message timed out"),
    SaltClientTimeout("Salt request timed out"),
    ConnectionRefusedError(111, "Connection refused"),
], ids=lambda e: type(e).__name__)
def test_master_not_answering_is_transient(exc: Exception) -> None:
    local = FakeClient(exc)
    master = master_with(local)
    with pytest.raises(SaltMasterUnavailable) as info:
        master.cmd("hv", "virt.start", ["vm"])
    assert isinstance(info.value, SaltTransientError)
    assert str(info.value) == (f"Salt master ({CONFIG}) did not take virt.start for hv: "
                               f"{type(exc).__name__}: {exc}")
    assert local.destroyed


def test_master_refusing_is_not_transient() -> None:
    master = master_with(FakeClient(AuthorizationError("not allowed to run virt.start")))
    with pytest.raises(SaltError) as info:
        master.cmd("hv", "virt.start", ["vm"])
    assert type(info.value) is SaltError
    assert "refused virt.start for hv: AuthorizationError: not allowed" in str(info.value)


def test_a_failing_command_is_not_transient() -> None:
    state_ret = {"pkg_|-libvirt_|-libvirt_|-installed": {
        "result": False, "__id__": "libvirt", "__sls__": "hypervisor", "comment": "no repo"}}
    master = master_with(FakeClient({"hv": {"ret": state_ret, "retcode": 2}}))
    with pytest.raises(SaltCommandFailed) as info:
        master.cmd("hv", "state.apply")
    assert not isinstance(info.value, SaltTransientError)
    assert str(info.value) == ("state.apply on 'hv' failed (retcode 2): "
                               "libvirt (hypervisor): no repo")


def test_cmd_async_master_down_is_transient() -> None:
    master = master_with(FakeClient(SaltClientError("could not be contacted")))
    with pytest.raises(SaltMasterUnavailable, match="did not take state.highstate for hv"):
        master.cmd_async("hv", "state.highstate")


def test_wheel_master_down_is_transient_then_renewed() -> None:
    first = FakeClient(SaltReqTimeoutError("Message timed out"))
    second = FakeClient({"minions": ["hv"], "minions_pre": ["vm"]})
    master = master_with(first, second, wheel=True)
    with pytest.raises(SaltMasterUnavailable, match="did not take key.list_all: SaltReqTimeoutError"):
        master.key_state("hv")
    assert first.destroyed
    assert master.key_state("vm") == "pending"


def test_a_stores_two_keys_go_in_one_deletion_whatever_their_state() -> None:
    """One `key.delete_dict` for both minions (the master rotates its AES key once per
    deletion call), naming exactly their ids in the buckets they are in; nothing to delete
    makes no call."""
    wheel = FakeClient({"minions": ["store-a-hv", "store-ab-hv"], "minions_pre": ["store-a-vm"],
                        "minions_denied": ["store-a-hv"]}, True,
                       {"minions": ["store-ab-hv"]})
    master = master_with(wheel, wheel=True)
    assert master.delete_keys(["store-a-hv", "store-a-vm"]) == ["store-a-hv", "store-a-vm"]
    assert [call[0] for call in wheel.calls] == ["key.list_all", "key.delete_dict"]
    assert wheel.options[1]["kwarg"] == {"match": {"minions": ["store-a-hv"],
                                                   "minions_pre": ["store-a-vm"],
                                                   "minions_denied": ["store-a-hv"]}}
    assert master.delete_keys(["store-a-hv", "store-a-vm"]) == []
    assert [call[0] for call in wheel.calls] == ["key.list_all", "key.delete_dict",
                                                 "key.list_all"]


class FakeBus:
    def __init__(self, *events: dict[str, Any]) -> None:
        self.events = list(events)

    def get_event(self, wait: float, full: bool) -> dict[str, Any] | None:
        return self.events.pop(0) if self.events else None


def test_an_event_that_does_not_come_is_transient() -> None:
    bus = FakeBus({"tag": "salt/auth", "data": {"id": "other"}})
    seen: list[str] = []
    with pytest.raises(SaltEventTimeout, match="^no event store/hypervisor/ready within 0s$"):
        master_with().wait_for_event(bus, lambda e: e.tag == "store/hypervisor/ready", timeout=0.2,
                                     what="store/hypervisor/ready", seen=lambda e: seen.append(e.tag))
    assert seen == ["salt/auth"]


def test_missing_master_config_is_not_transient() -> None:
    with pytest.raises(SaltError) as info:
        SaltMasterClient(CONFIG).cmd("hv", "test.ping")
    assert type(info.value) is SaltError
    assert str(info.value) == f"Salt master config {CONFIG} not found (setting salt_master_config)"


def test_new_clients_load_salt_one_at_a_time() -> None:
    """Salt's loader is not thread-safe: stores of one batch (threads) that built their wheel
    clients at once failed loading grains. Building a client and its first call are serialised;
    later calls run in parallel."""
    import threading
    import time

    busy = {"now": 0, "most": 0, "first_calls": 0}
    lock = threading.Lock()

    class SlowFirstWheel:
        def __init__(self) -> None:
            self.used = False

        def cmd(self, fun: str, **_kw: object) -> dict[str, list[str]]:
            with lock:
                busy["now"] += 1
                busy["most"] = max(busy["most"], busy["now"]) if not self.used else busy["most"]
                busy["first_calls"] += not self.used
            time.sleep(0.05)  # the grains a real first call loads
            with lock:
                busy["now"] -= 1
            self.used = True
            return {"minions": []}

    clients = [SaltMasterClient("unused", wheel_client=SlowFirstWheel) for _ in range(8)]
    threads = [threading.Thread(target=c.list_keys) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert busy["first_calls"] == 8 and busy["most"] == 1, busy


def test_master_log_tail_finds_a_refused_auth_protocol_from_now_on(tmp_path: Path) -> None:
    """The master logs a refused auth protocol and fires no event: step 3 reads the lines it
    logs from the moment it starts waiting, a line still being written next time, and a
    rotated log from its start."""
    from tasks.salt.masterlog import AuthRefusal, MasterLogTail

    line = ("2026-11-25 10:00:00,000 [salt.channel.server:340 ][WARNING ][77] Rejected "
            "authentication attempt from minion '{}' using protocol version 2 (minimum "
            "required: 3)\n")
    log = tmp_path / "master.log"
    log.write_text(line.format("store-0001-hv"))  # before the wait: not this wait's business
    tail = MasterLogTail(log)
    assert tail.auth_refusals("store-0001-hv") == []
    with log.open("a") as fh:
        fh.write(line.format("store-0002-hv"))
        fh.write(line.format("store-0001-hv")[:40])  # half a line so far
    assert tail.auth_refusals("store-0001-hv") == []
    with log.open("a") as fh:
        fh.write(line.format("store-0001-hv")[40:])
    assert tail.auth_refusals("store-0001-hv") == [AuthRefusal("store-0001-hv", 2, 3)]
    log.write_text(line.format("store-0001-hv").replace("version 2", "version 1"))  # rotated
    assert tail.auth_refusals("store-0001-hv") == [AuthRefusal("store-0001-hv", 1, 3)]
    assert MasterLogTail(None).auth_refusals("store-0001-hv") == []


def test_a_store_s_minions_are_forgotten_tokens_first_then_both_keys_in_one_call() -> None:
    """Decommission and a replacement's retirement share it: a token left behind would sign
    in a box that kept the store's install profile."""
    from tasks.salt.store_keys import forget_store_minions

    calls: list[Any] = []

    class Master:
        def revoke_token(self, minion: str) -> bool:
            calls.append(("revoke", minion))
            return minion.endswith("-vm")

        def delete_keys(self, minions: list[str]) -> list[str]:
            calls.append(("delete", tuple(minions)))
            return minions[:1]

    from store_rollout.inventory import parse_inventory

    store = parse_inventory({"stores": [{
        "store_id": "0007", "erp": {"site_code": "S"},
        "hypervisor": {"hostname": "hv.example", "mac": "52:54:00:00:00:07"}}]}).stores[0]
    assert forget_store_minions(Master(), store) == {  # type: ignore[arg-type]
        "keys_deleted": ["store-0007-hv"], "tokens_revoked": ["store-0007-vm"]}
    assert calls == [("revoke", "store-0007-hv"), ("revoke", "store-0007-vm"),
                     ("delete", ("store-0007-hv", "store-0007-vm"))]


def test_an_answer_is_what_the_minions_key_sent_not_what_the_bus_shows(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 44: another minion can fire `salt/job/<jid>/ret/<id>` on the bus first; the
    answer is the job cache's (written by the master under the authenticated id)."""
    forged = {"vm": {"ret": {"result": True, "checks": []}, "retcode": 0}}
    real = {"vm": {"return": {"result": False, "checks": ["pos down"]}, "retcode": 1}}
    master = master_with(FakeClient(forged, cache=real))
    with caplog.at_level("WARNING"), pytest.raises(SaltCommandFailed, match="retcode 1"):
        master.cmd("vm", "storegate.run", timeout=1)
    assert "differs from the one its key sent" in caplog.text and "vm's" in caplog.text


def test_a_return_only_on_the_bus_is_no_answer(caplog: pytest.LogCaptureFixture) -> None:
    """The minion itself never answered: a forged return alone is no answer at all."""
    master = master_with(FakeClient({"vm": {"ret": True, "retcode": 0}}, cache={}))
    with caplog.at_level("WARNING"), pytest.raises(SaltMinionNoResponse):
        master.cmd("vm", "test.ping", timeout=0.3)
    assert "holds none from that minion's key: forged" in caplog.text, caplog.text


def test_a_master_without_a_job_cache_is_refused() -> None:
    local = FakeClient({"vm": {"ret": True, "retcode": 0}})
    local.opts = {"job_cache": False, "master_job_cache": "local_cache"}
    with pytest.raises(SaltError, match="job_cache: True"):
        master_with(local).cmd("vm", "test.ping", timeout=1)
