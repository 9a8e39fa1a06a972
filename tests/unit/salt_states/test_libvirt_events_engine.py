"""The hypervisor's libvirt events engine (salt_states/_engines/store_libvirt_events.py) keeps
its libvirt connection: a connection closed under it (the daemon restarted, or gone silent and
given up by the keepalive) is announced, reconnected with a growing delay and announced again
when it is back, with the domains' states; a loss outlives a restart of the engine; a sync that
replaced its file ends it so that the minion starts the new one.

Driven here with a fake libvirt (connections that die on cue) and Salt 3006.0's own built-in
libvirt_events engine from the sdist `make setup` downloads, whose callbacks and event helper it
reuses, and once in a real Salt 3006.30 minion (the file replaced under it); the same engine
under Python 3.6 and Salt 3006.0's loader on libvirt's test driver is in
tests/unit/salt_states/test_host_python36.py, and a real libvirtd restart in the lab in
tests/lab/test_plan_reconcile.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.state import HOST_SALT_BIN, REPO_ROOT, SALT_STATES_DIR
from store_rollout.contracts import (
    LIBVIRT_CONNECTION_LOST,
    LIBVIRT_CONNECTION_RESTORED,
    LIBVIRT_EVENT_TAG_PREFIX,
    LIBVIRT_EVENTS_ENGINE,
)
from tests.helpers import load_salt_module, wait_for

ENGINE = SALT_STATES_DIR / "_engines" / f"{LIBVIRT_EVENTS_ENGINE}.py"
FORWARDER = SALT_STATES_DIR / "_engines" / "store_prefect_events.py"
SDIST = Path(os.environ.get("STORE_ROLLOUT_SALT3006_SDIST",
                            REPO_ROOT / ".cache" / "salt-3006.0.tar.gz"))
BUILTIN_IN_SDIST = "salt-3006.0/salt/engines/libvirt_events.py"
URI = "xen:///system"
PREFIX = f"{LIBVIRT_EVENT_TAG_PREFIX}/xen/system/"
# libvirt's numbers: virConnectCloseReason, virDomainEventType / its STOPPED detail
EOF_, KEEPALIVE = 1, 2
STARTED, STOPPED, DESTROYED = 2, 5, 1
# the built-in engine's helpers this engine calls: the same names and parameters in 3006.0
# (Leap's) and 3006.30 (the lab's)
HELPERS = {"__virtual__": [], "_register_callback": ["cnx", "tag_prefix", "obj", "event", "real_id"],
           "_append_callback_id": ["ids", "obj", "callback_id"],
           "_callbacks_cleanup": ["cnx", "callback_ids"],
           "_salt_send_event": ["opaque", "conn", "data"]}


def builtin_source_3006_0() -> str:
    if not SDIST.exists():
        pytest.fail(f"{SDIST} missing: `make setup` downloads Salt 3006.0's sdist")
    with tarfile.open(SDIST) as sdist:
        member = sdist.extractfile(BUILTIN_IN_SDIST)
        assert member is not None
        return member.read().decode()


@pytest.fixture(scope="module")
def builtin() -> types.ModuleType:
    """Salt 3006.0's salt.engines.libvirt_events (Salt 3008, this venv's, has none)."""
    module = types.ModuleType("salt.engines.libvirt_events")
    exec(compile(builtin_source_3006_0(), BUILTIN_IN_SDIST, "exec"), module.__dict__)  # noqa: S102
    return module


@pytest.fixture(scope="module")
def engine(builtin: types.ModuleType) -> Iterator[Any]:
    import salt.engines  # noqa: F401  (the package, which the engine's import goes through)

    saved = sys.modules.get(builtin.__name__)
    sys.modules[builtin.__name__] = builtin
    try:
        spec = importlib.util.spec_from_file_location("store_libvirt_events_under_test", ENGINE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules[builtin.__name__]
        else:
            sys.modules[builtin.__name__] = saved
    assert module.builtin is builtin
    yield module


# -- a libvirt that dies on cue --------------------------------------------------------------

class LibvirtError(Exception):
    pass


class FakeDomain:
    def __init__(self, name: str, state: int = 1) -> None:
        self._name, self._state = name, state

    def name(self) -> str:
        return self._name

    def ID(self) -> int:
        return 7

    def UUIDString(self) -> str:
        return f"uuid-{self._name}"

    def state(self) -> list[int]:
        return [self._state, 0]


class FakeConn:
    def __init__(self, domains: list[FakeDomain]) -> None:
        self.domains = domains
        self.dead = False
        self.closed = False
        self.close_cb: tuple[Callable[..., None], Any] | None = None
        self.keepalive: tuple[int, int] | None = None
        self.callbacks: dict[int, tuple[int, Callable[..., None], Any]] = {}
        self.deregistered: list[int] = []
        self.next_id = 0  # libvirt numbers callbacks from 0

    # the calls the engine and the built-in helpers make
    def registerCloseCallback(self, cb: Callable[..., None], opaque: Any) -> int:
        self.close_cb = (cb, opaque)
        return 0

    def unregisterCloseCallback(self) -> int:
        self.close_cb = None
        return 0

    def setKeepAlive(self, interval: int, count: int) -> int:
        self.keepalive = (interval, count)
        return 0

    def getURI(self) -> str:
        return URI

    def isAlive(self) -> int:
        return 0 if self.dead else 1

    def domainEventRegisterAny(self, dom: Any, event_id: int, cb: Callable[..., None],
                               opaque: Any) -> int:
        self.next_id += 1
        self.callbacks[self.next_id - 1] = (event_id, cb, opaque)
        return self.next_id - 1

    def domainEventDeregisterAny(self, callback_id: int) -> int:
        self.callbacks.pop(callback_id)
        self.deregistered.append(callback_id)
        if self.dead:  # as the remote driver: freed on this side, then the RPC fails
            raise LibvirtError("client socket is closed")
        return 0

    def listAllDomains(self, flags: int) -> list[FakeDomain]:
        return self.domains

    def close(self) -> int:
        self.closed = True
        return 0

    # what the daemon does
    def lifecycle(self, dom: FakeDomain, event: int, detail: int) -> None:
        for _event_id, cb, opaque in list(self.callbacks.values()):
            cb(self, dom, event, detail, opaque)

    def die(self, reason: int, notify: bool = True) -> None:
        self.dead = True
        if notify and self.close_cb:
            cb, opaque = self.close_cb
            cb(self, reason, opaque)


class FakeLibvirt:
    """openReadOnly answers from `answers` (a connection, or None: the daemon is down); each
    virEventRunDefaultImpl runs the next of `ticks` (what happens while the loop waits)."""

    libvirtError = LibvirtError

    def __init__(self, clock: FakeClock, answers: list[FakeConn | None],
                 ticks: list[Callable[[], None]]) -> None:
        self.clock, self.answers, self.ticks = clock, answers, ticks
        self.opened: list[FakeConn] = []

    def openReadOnly(self, uri: str) -> FakeConn:
        assert uri == URI
        answer = self.answers.pop(0)
        if answer is None:
            raise LibvirtError("Failed to connect socket to '/var/run/libvirt/virtxend-sock-ro'")
        self.opened.append(answer)
        return answer

    def virEventRunDefaultImpl(self) -> int:
        self.clock.now += 60  # a quiet minute in the loop
        self.ticks.pop(0)()
        return 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class StopAfter:
    """Stands in for the engine's Source: `changed()` once `stop()` was called."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def changed(self) -> bool:
        return self.stopped


@pytest.fixture
def sent(builtin: types.ModuleType) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """What the engine sends on the minion's bus (the built-in helper's event.send)."""
    events: list[tuple[str, dict[str, Any]]] = []
    builtin.__opts__ = {}  # type: ignore[attr-defined]
    builtin.__salt__ = {"event.send": lambda tag, data: events.append((tag, data))}  # type: ignore[attr-defined]
    yield events
    del builtin.__opts__, builtin.__salt__


def watcher(engine: Any, builtin: types.ModuleType, lib: FakeLibvirt, tmp_path: Path,
            source: StopAfter, **kwargs: Any) -> Any:
    return engine.Watcher(lib, builtin, URI, LIBVIRT_EVENT_TAG_PREFIX, ["domain/lifecycle"],
                          state_path=str(tmp_path / engine.STATE_FILE), source=source,
                          clock=lib.clock, sleep=lib.clock.sleep, **kwargs)


# -- the behaviour ---------------------------------------------------------------------------

def test_a_restarted_daemon_is_announced_reconnected_and_its_events_still_arrive(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path) -> None:
    vm = FakeDomain("store-0042-vm")
    first, second = FakeConn([vm]), FakeConn([vm])
    clock, source = FakeClock(), StopAfter()
    ticks = [
        lambda: first.lifecycle(vm, STOPPED, DESTROYED),
        lambda: first.lifecycle(vm, STARTED, 0),
        lambda: first.die(EOF_),  # virtxend restarted: its socket closed under the engine
        lambda: second.lifecycle(vm, STOPPED, DESTROYED),
        source.stop,
    ]
    lib = FakeLibvirt(clock, [first, None, None, second], ticks)
    watcher(engine, builtin, lib, tmp_path, source).run()

    assert [tag for tag, _ in sent] == [
        PREFIX + "domain/lifecycle", PREFIX + "domain/lifecycle", PREFIX + LIBVIRT_CONNECTION_LOST,
        PREFIX + LIBVIRT_CONNECTION_RESTORED, PREFIX + "domain/lifecycle"]
    assert sent[0][1]["event"] == "stopped" and sent[0][1]["detail"] == "destroyed"
    assert sent[2][1] == {"uri": URI, "reason": "eof"}
    # down while the daemon refused two connects (1 s, then 2 s): the states to catch up with
    assert sent[3][1] == {"uri": URI, "reason": "eof", "down_seconds": 3.0, "attempts": 2,
                          "domains": {"store-0042-vm": "running"}}
    assert sent[4][1]["domain"]["name"] == "store-0042-vm"
    assert clock.slept == [1.0, 2.0]  # the first connection had lasted: reconnect at once
    # both connections watched alike; the dead one let go, each callback on its own
    assert first.keepalive == second.keepalive == (5, 3)
    assert first.closed and first.close_cb is None and first.deregistered == [0]
    assert second.closed and second.deregistered == [0]  # its file changed: the engine returned
    assert not (tmp_path / engine.STATE_FILE).exists()


def test_a_silent_daemon_is_given_up_by_the_keepalive(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path) -> None:
    first, second = FakeConn([]), FakeConn([])
    clock, source = FakeClock(), StopAfter()
    lib = FakeLibvirt(clock, [first, second], [lambda: first.die(KEEPALIVE), source.stop])
    watcher(engine, builtin, lib, tmp_path, source, keepalive_interval=10,
            keepalive_count=2).run()
    assert first.keepalive == (10, 2)
    assert [(tag, data.get("reason")) for tag, data in sent] == [
        (PREFIX + LIBVIRT_CONNECTION_LOST, "keepalive"),
        (PREFIX + LIBVIRT_CONNECTION_RESTORED, "keepalive")]


def test_a_connection_found_dead_without_its_close_callback_counts_as_lost(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path) -> None:
    first, second = FakeConn([]), FakeConn([])
    clock, source = FakeClock(), StopAfter()
    lib = FakeLibvirt(clock, [first, second], [lambda: first.die(EOF_, notify=False), source.stop])
    watcher(engine, builtin, lib, tmp_path, source).run()
    assert [data.get("reason") for _, data in sent] == ["error", "error"]


def test_a_connection_that_drops_at_once_is_retried_later_each_time(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path) -> None:
    conns = [FakeConn([]) for _ in range(7)]
    clock, source = FakeClock(), StopAfter()

    def die(conn: FakeConn) -> Callable[[], None]:
        def tick() -> None:
            clock.now -= 59  # only a second in the loop: the connection did not last
            conn.die(EOF_)
        return tick

    lib = FakeLibvirt(clock, list(conns), [*[die(c) for c in conns[:6]], source.stop])
    watcher(engine, builtin, lib, tmp_path, source, retry_max=8).run()
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert len(sent) == 12  # lost and restored each time, but never in a tight loop


def test_a_loss_outlives_a_restart_of_the_engine(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path) -> None:
    """The minion restarted while libvirt was away: the new engine process reports the
    restoration of the loss the old one announced."""
    clock, source = FakeClock(), StopAfter()
    before = watcher(engine, builtin, FakeLibvirt(clock, [FakeConn([])], []), tmp_path, source)
    before.connect()
    before.disconnect()
    before.mark_lost("eof")
    state = json.loads((tmp_path / engine.STATE_FILE).read_text())
    assert state == {"since": clock.now, "reason": "eof", "uri": URI}

    clock.now += 120
    lib = FakeLibvirt(clock, [None, FakeConn([FakeDomain("store-0042-vm", 5)])], [source.stop])
    watcher(engine, builtin, lib, tmp_path, source).run()
    assert [tag for tag, _ in sent] == [PREFIX + LIBVIRT_CONNECTION_LOST,
                                        PREFIX + LIBVIRT_CONNECTION_RESTORED]
    assert sent[1][1]["down_seconds"] == 121.0 and sent[1][1]["reason"] == "eof"
    assert sent[1][1]["domains"] == {"store-0042-vm": "shutoff"}
    assert not (tmp_path / engine.STATE_FILE).exists()


def test_no_daemon_at_all_is_retried_quietly(
        engine: Any, builtin: types.ModuleType, sent: list[tuple[str, dict[str, Any]]],
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before the reboot into Xen there is no virtxend socket: no event (nothing was lost), one
    warning, and a doubling wait up to retry_max."""
    clock, source = FakeClock(), StopAfter()
    lib = FakeLibvirt(clock, [None] * 6 + [FakeConn([])], [source.stop])
    with caplog.at_level("DEBUG"):
        watcher(engine, builtin, lib, tmp_path, source, retry_max=10).run()
    assert sent == []
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot connect to xen:///system" in warnings[0].getMessage()


def test_a_sync_that_replaces_the_engine_file_ends_it(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.py"
    path.write_text("old\n")
    now = [0.0]
    source = engine.Source(str(path), every=5, clock=lambda: now[0])
    path.write_text("new\n")
    assert not source.changed()  # looked at most every 5 s
    now[0] = 5
    assert source.changed()
    path.write_text("old\n")
    os.utime(path, (1, 1))
    now[0] = 10
    assert not source.changed()  # touched, same text
    path.unlink()
    now[0] = 15
    assert not source.changed()  # removed: keep running the code it has


def test_a_running_minion_restarts_the_engine_from_a_replaced_file(tmp_path: Path) -> None:
    """The update path on a real minion (Salt 3006.30, the lab hypervisors'; no master needed):
    a sync replaces the engine's file, the engine returns, and the minion's process manager
    starts it again from the new file, no minion restart."""
    engines = tmp_path / "engines"
    engines.mkdir()
    copy = engines / ENGINE.name
    copy.write_text(ENGINE.read_text())
    (tmp_path / "etc").mkdir()
    # a short root_dir: the minion's event sockets live under it (sun_path holds 108 bytes)
    root = Path(tempfile.mkdtemp(prefix="sre-", dir="/tmp"))
    log = root / "minion.log"
    (tmp_path / "etc" / "minion").write_text(json.dumps({
        "id": "engine-reload", "user": "root", "master_type": "disable", "file_client": "local",
        "root_dir": str(root), "log_file": str(log),
        "log_level_logfile": "info", "engines_dirs": [str(engines)], "multiprocessing": False,
        "engines": [{LIBVIRT_EVENTS_ENGINE: {"uri": "test:///default",
                                             "tag_prefix": LIBVIRT_EVENT_TAG_PREFIX,
                                             "filters": ["domain/lifecycle"]}}]}))
    proc = subprocess.Popen([str(HOST_SALT_BIN / "salt-minion"), "-c", str(tmp_path / "etc"),
                             "-l", "quiet"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def watching() -> list[str]:
        text = log.read_text() if log.exists() else ""
        return [line for line in text.splitlines() if "watching test:///default" in line]

    try:
        wait_for(lambda: watching(), timeout=30, interval=0.2, what="the engine's first start")
        copy.write_text(copy.read_text().replace('"store_libvirt_events: watching',
                                                 '"store_libvirt_events (synced): watching'))
        started = time.monotonic()
        wait_for(lambda: any("(synced)" in line for line in watching()), timeout=30,
                 interval=0.2, what="the engine started again from its new file")
        print(f"engine restarted from its new file {time.monotonic() - started:.1f} s after it "
              "was replaced")
        pids = [re.search(r"\]\[(\d+)\] ", line).group(1) for line in watching()]  # type: ignore[union-attr]
        assert len(pids) == 2 and pids[0] != pids[1], pids  # a new engine process
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the minion and its engine; nothing else to keep
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_the_built_in_helpers_it_calls_are_the_same_in_salt_3006_0_and_3006_30() -> None:
    pythonlib = next((HOST_SALT_BIN.parent / "lib").glob("python3*"))
    sources = {"3006.0": builtin_source_3006_0(),
               "3006.30": (pythonlib / "site-packages/salt/engines/libvirt_events.py").read_text()}
    for version, source in sources.items():
        tree = ast.parse(source)
        functions = {n.name: [a.arg for a in n.args.args] for n in tree.body
                     if isinstance(n, ast.FunctionDef)}
        for name, params in HELPERS.items():
            assert functions.get(name) == params, (version, name, functions.get(name))
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
        assert {"CALLBACK_DEFS", "REGISTER_FUNCTIONS"} <= assigned, version
    used = {n.attr for n in ast.walk(ast.parse(ENGINE.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
            and n.value.attr == "events"}
    assert used <= {*HELPERS, "CALLBACK_DEFS"}, used


def test_the_engine_file_is_its_own_cobbler_snippet() -> None:
    """Cobbler renders the snippet with Cheetah: a dollar sign starts a placeholder, a hash
    sign followed by a word starts a directive (tests/unit/salt_states/test_salt_render.py renders
    it)."""
    for number, line in enumerate(ENGINE.read_text().splitlines(), start=1):
        assert "$" not in line, f"{ENGINE}:{number}: a dollar sign: {line}"
        assert "]]>" not in line, f"{ENGINE}:{number}: ends the profile's CDATA: {line}"
        for index in (i for i, char in enumerate(line) if char == "#"):
            assert line[index + 1:index + 2] in ("", " "), \
                f"{ENGINE}:{number}: a hash sign not followed by a space: {line}"


# -- the master's forwarding to Prefect ----------------------------------------------------------

@pytest.fixture(scope="module")
def forwarder() -> Any:
    return load_salt_module("_engines", "store_prefect_events")


def test_lost_and_restored_reach_prefect_related_to_the_hypervisors_store(forwarder: Any) -> None:
    tag = PREFIX + LIBVIRT_CONNECTION_RESTORED
    data = {"id": "store-0042-hv", "data": {
        "uri": URI, "reason": "eof", "down_seconds": 3.0, "attempts": 2,
        "domains": {"store-0042-vm": "running", "store-0043-vm": "running"}}}
    event = forwarder._connection_event(tag, data)
    assert event["event"] == "salt.store.libvirt.connection.restored"
    assert event["resource"] == {"prefect.resource.id": "salt.minion.store-0042-hv",
                                 "store.id": "0042"}
    assert {r["prefect.resource.id"] for r in event["related"]} == {"store.0042",
                                                                     "prefect.tag.store-0042"}
    # only the store's own VM: in the lab every hypervisor watches the one libvirtd
    assert event["payload"] == {"hypervisor": "store-0042-hv", "uri": URI, "reason": "eof",
                                "down_seconds": 3.0, "attempts": 2,
                                "domains": {"store-0042-vm": "running"}}
    lost = forwarder._connection_event(PREFIX + LIBVIRT_CONNECTION_LOST,
                                       {"id": "lab-host", "data": {"uri": URI, "reason": "eof"}})
    assert lost["event"] == "salt.store.libvirt.connection.lost" and lost["related"] == []
    assert forwarder._connection_event(PREFIX + "domain/lifecycle", data) is None


def test_a_refreshed_boxs_domain_events_reach_prefect_and_another_stores_box_does_not(
        forwarder: Any) -> None:
    # issue 48: the store's new box signs in as store-<id>-hv-<its MAC's last 6 hex digits>
    def lifecycle(hypervisor: str) -> Any:
        return forwarder._domain_event({"id": hypervisor, "data": {
            "domain": {"name": "store-0042-vm"}, "event": "started"}})

    for own in ("store-0042-hv", "store-0042-hv-a1b2c3"):
        assert lifecycle(own)["resource"]["store.id"] == "0042", own
    for other in ("store-0043-hv", "store-0043-hv-a1b2c3", "store-0042-hv-xyz", "store-0042-vm"):
        assert lifecycle(other) is None, other
    restored = forwarder._connection_event(PREFIX + LIBVIRT_CONNECTION_RESTORED, {
        "id": "store-0042-hv-a1b2c3", "data": {"uri": URI, "domains": {"store-0042-vm": "running"}}})
    assert restored["resource"]["store.id"] == "0042"
    assert restored["payload"]["domains"] == {"store-0042-vm": "running"}
