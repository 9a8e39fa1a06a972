"""CobblerClient maps Cobbler's faults and transport failures to the CobblerError tree.

A fake Cobbler (xmlrpc.server, faults in Cobbler 3.3's format) and a plain HTTP server that
answers with a chosen status or body run on 127.0.0.1 in a thread of the test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

import pytest

from tasks.cobbler import (
    CobblerAuthError,
    CobblerClient,
    CobblerError,
    CobblerNotFound,
    CobblerRejected,
    CobblerUnavailable,
    SystemSpec,
)
from tests.local_servers import refused_url, resetting_url, serving, silent_url

USER, PASSWORD = "rollout", "s3cret-Pa55"
TIMEOUT = 0.5
SPEC = SystemSpec(name="hv-2", hostname="hv-2.example", mac="52:54:00:00:00:02",
                  profile="store-hypervisor")


class CX(Exception):
    """Cobbler's exception: xmlrpc.server sends it as Fault(1, "<class '...CX'>:'text'")."""

    def __str__(self) -> str:
        return repr(self.args[0])


class FakeCobbler:
    def __init__(self) -> None:
        self.token = "tok-1"
        self.logins = 0
        self.systems = {"hv-1": {"name": "hv-1", "netboot_enabled": True}}
        # Cobbler 3.3 answers False, not a fault, where it did nothing (remote.py): its setting
        # pxe_just_once off makes disable_netboot do nothing; `answers` the other calls' answers
        self.pxe_just_once = True
        self.answers: dict[str, bool] = {}
        self.modified: list[tuple[str, str, Any]] = []
        self.sync_seconds, self.sync_done_at = 0.0, 0.0
        self.status_reads: list[float] = []

    def _dispatch(self, method: str, params: tuple[Any, ...]) -> Any:
        return getattr(self, f"do_{method}")(*params)

    def do_version(self) -> float:
        return 3.3

    def do_login(self, user: str, password: str) -> str:
        self.logins += 1
        if (user, password) != (USER, PASSWORD):  # echoes the password: the client must not
            raise CX(f"login failed ({user}, {password})")
        return self.token

    def do_get_system(self, name: str) -> Any:
        return self.systems.get(name, "~")

    def do_get_system_handle(self, name: str, token: str) -> str:
        self.check(token)
        if name not in self.systems:
            raise CX(f"internal error, unknown system name {name}")
        return f"system::{name}"

    def do_disable_netboot(self, name: str, token: str) -> bool:
        self.check(token)
        if not self.pxe_just_once or name not in self.systems:
            return False
        self.systems[name]["netboot_enabled"] = False
        return True

    def do_modify_system(self, handle: str, key: str, value: Any, token: str) -> bool:
        self.modified.append((handle, key, value))
        if key == "mac_address":
            raise CX(f"invalid MAC address format ({value})")
        return True

    def do_find_system(self, criteria: dict[str, str]) -> list[str]:
        return []

    def do_new_system(self, token: str) -> str:
        return "___NEW___system::1"

    def do_save_system(self, handle: str, token: str) -> bool:
        return self.answers.get("save_system", True)

    def do_sync(self, token: str) -> bool:
        return self.answers.get("sync", True)

    def do_background_syncsystems(self, options: dict[str, Any], token: str) -> str:
        self.check(token)
        self.sync_done_at = time.monotonic() + self.sync_seconds
        return "task-1"

    def do_get_task_status(self, task_id: str) -> list[Any]:
        self.status_reads.append(time.monotonic())
        done = time.monotonic() >= self.sync_done_at
        # Cobbler 3.3: [start time, name, state, ...]
        return [0.0, "Syncsystems", "complete" if done else "running"]

    def do_remove_system(self, name: str, token: str) -> bool:
        return self.answers.get("remove_system", True)

    def check(self, token: str) -> None:
        if token != self.token:
            raise CX(f"invalid token: {token}")


class _Handler(SimpleXMLRPCRequestHandler):
    rpc_paths = ("/cobbler_api",)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def cobbler() -> Iterator[tuple[FakeCobbler, CobblerClient]]:
    fake = FakeCobbler()
    server = SimpleXMLRPCServer(("127.0.0.1", 0), _Handler, logRequests=False, allow_none=True)
    server.register_instance(fake)
    with serving(server) as base:
        yield fake, CobblerClient(url=f"{base}/cobbler_api", user=USER, password=PASSWORD,
                                  timeout=TIMEOUT)


class Answer(BaseHTTPRequestHandler):
    """Answers every POST with the server's `status` and `body`."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def answering(status: int, body: bytes = b"") -> CobblerError:
    """What a login against a server answering `status`/`body` raises."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.answer = (status, body)  # type: ignore[attr-defined]
    with serving(server) as base:
        return login_error(f"{base}/cobbler_api")


def login_error(url: str) -> CobblerError:
    client = CobblerClient(url=url, user=USER, password=PASSWORD, timeout=TIMEOUT)
    with pytest.raises(CobblerError) as info:
        client.token()
    assert PASSWORD not in str(info.value)
    return info.value


def test_calls_that_work(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    fake, client = cobbler
    assert client.version() == 3.3
    assert client.get_system("hv-1") == {"name": "hv-1", "netboot_enabled": True}
    assert client.get_system("hv-9") is None  # Cobbler's '~'
    client.disable_netboot("hv-1")
    assert fake.systems["hv-1"]["netboot_enabled"] is False and fake.logins == 1


def test_unknown_object_is_not_found(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    _, client = cobbler
    with pytest.raises(CobblerNotFound, match="^Cobbler get_system_handle: 'internal error, "
                                              "unknown system name hv-9'$") as info:
        client.set_autoinstall_meta("hv-9", {})
    assert (info.value.operation, info.value.subject, info.value.status) == (
        "get_system_handle", "hv-9", None)


def test_upsert_clears_the_bmc_login_an_older_record_holds(
        cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    """Cobbler hands power_pass back to any get_system caller: the record keeps none."""
    fake, client = cobbler
    fake.systems["hv-2"] = {"name": "hv-2", "power_user": "admin", "power_pass": "bmc-secret",
                            "power_address": "10.0.0.9", "power_id": ""}
    client.upsert_system(SPEC)
    cleared = {key: value for handle, key, value in fake.modified if key.startswith("power_")}
    assert cleared == {"power_user": "", "power_pass": "", "power_address": ""}
    fake.modified.clear()
    fake.systems["hv-2"] = {"name": "hv-2", "power_pass": "", "power_user": ""}
    client.upsert_system(SPEC)  # nothing to clear: no call for it
    assert not [key for _, key, _ in fake.modified if key.startswith("power_")]


def test_set_autoinstall_meta_writes_and_saves(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    fake, client = cobbler
    client.set_autoinstall_meta("hv-1", {"install_power_cycled_at": "2026-11-26T15:00:00+00:00"})
    assert fake.modified == [("system::hv-1", "autoinstall_meta",
                              {"install_power_cycled_at": "2026-11-26T15:00:00+00:00"})]
    fake.answers["save_system"] = False
    with pytest.raises(CobblerRejected, match="save_system hv-1"):
        client.set_autoinstall_meta("hv-1", {})


def test_refused_value_is_rejected(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    _, client = cobbler
    with pytest.raises(CobblerRejected, match="modify_system mac_address: 'invalid MAC") as info:
        client._modify("hv-1", "system::hv-1", "mac_address", "zz")
    assert (info.value.operation, info.value.subject) == ("modify_system", "hv-1")


def test_login_refused_names_the_user_never_the_password(
        cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    url = cobbler[1].url
    client = CobblerClient(url=url, user=USER, password="wrong-" + PASSWORD, timeout=TIMEOUT)
    with pytest.raises(CobblerAuthError) as info:
        client.token()
    assert str(info.value) == f"Cobbler at {url}: login failed for {USER!r}"
    assert PASSWORD not in str(info.value)


def test_expired_token_is_retryable_and_renewed(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    fake, client = cobbler
    client.token()
    fake.token = "tok-2"  # Cobbler restarted: the client's token is gone
    with pytest.raises(CobblerUnavailable, match="disable_netboot hv-1: token expired"):
        client.disable_netboot("hv-1")
    client.disable_netboot("hv-1")  # the next attempt logs in again
    assert fake.logins == 2


def test_disable_netboot_answered_false_is_an_error(
        cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    fake, client = cobbler
    fake.pxe_just_once = False
    with pytest.raises(CobblerRejected, match=r"^Cobbler answered False to disable_netboot hv-1: "
                                              r"netboot of system 'hv-1' is still on: set "
                                              r"pxe_just_once: true in Cobbler's settings") as info:
        client.disable_netboot("hv-1")
    assert (info.value.operation, info.value.subject) == ("disable_netboot", "hv-1")
    assert fake.systems["hv-1"]["netboot_enabled"] is True
    with pytest.raises(CobblerRejected, match="netboot of system 'hv-9' is still on"):
        client.disable_netboot("hv-9")  # removed since it was looked up


def test_rollback_fails_when_cobbler_leaves_netboot_on(
        cobbler: tuple[FakeCobbler, CobblerClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback's Cobbler step (flows/store_rollback.py) fails, not "netboot: False"."""
    import tasks.cobbler.task
    from store_rollout.inventory import parse_inventory

    fake, client = cobbler
    store = parse_inventory({"stores": [{
        "store_id": "s1", "erp": {"site_code": "S1"},
        "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01"}}]}).get("s1")
    fake.systems[store.cobbler_system] = {"name": store.cobbler_system, "netboot_enabled": True}
    fake.pxe_just_once = False
    monkeypatch.setattr(tasks.cobbler.task, "cobbler_client", lambda _settings: client)
    with pytest.raises(CobblerRejected, match="netboot of system 'store-s1-hv' is still on"):
        tasks.cobbler.disable_hypervisor_netboot.fn(store, None)  # the client is given
    # not a transient failure: the task's retries do not wait it out
    assert not issubclass(CobblerRejected, CobblerUnavailable)


@pytest.mark.parametrize(("answer", "call", "message"), [
    ("save_system", lambda c: c.upsert_system(SPEC),
     "save_system hv-2: system 'hv-2' was not saved"),
    ("sync", lambda c: c.sync(), "sync: the PXE configs were not written"),
    ("remove_system", lambda c: c.remove_system("hv-1"),
     "remove_system hv-1: system 'hv-1' was not removed"),
])
def test_false_answer_is_an_error(cobbler: tuple[FakeCobbler, CobblerClient], answer: str,
                                  call: Callable[[CobblerClient], Any], message: str) -> None:
    fake, client = cobbler
    call(client)  # True: done
    fake.answers[answer] = False
    with pytest.raises(CobblerRejected, match=f"^Cobbler answered False to {re.escape(message)}"):
        call(client)


def test_sync_system_sees_a_short_sync_end_soon(cobbler: tuple[FakeCobbler, CobblerClient]) -> None:
    """A one-system sync takes tenths of a second: the wait for it ends within tens of ms of
    its end, not after a long first back-off (that was most of step 2's own time)."""
    fake, client = cobbler
    fake.sync_seconds = 0.15
    client.sync_system("hv-1")
    ended = time.monotonic()
    assert ended - fake.sync_done_at < 0.08
    assert 3 <= len(fake.status_reads) <= 8  # backs off: no busy poll


@pytest.mark.parametrize(("body", "ok"), [("True", True), ("True\n", True), ("False", False),
                                          ("", False)])
def test_simulated_installer_checks_the_nopxe_answer(body: str, ok: bool) -> None:
    """Cobbler's nopxe answers 200 with "False" when netboot stays on: the lab's installer
    (lab/simulator/firmware.py) stops there instead of starting the host as if installed."""
    from lab.simulator.firmware import Firmware

    url = "http://10.77.0.1:80/cblr/svc/op/nopxe/system/store-s1-hv"
    firmware = SimpleNamespace(_fetch={url: body}.__getitem__)
    if ok:
        Firmware._nopxe(firmware, url)  # type: ignore[arg-type]
        return
    with pytest.raises(RuntimeError, match=f"Cobbler answered {body!r} to {re.escape(url)}, "
                                           "not 'True': netboot stays on"):
        Firmware._nopxe(firmware, url)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "expected"), [
    (401, CobblerAuthError), (403, CobblerAuthError),
    (404, CobblerRejected), (400, CobblerRejected),
    (408, CobblerUnavailable), (429, CobblerUnavailable),
    (500, CobblerUnavailable), (502, CobblerUnavailable), (503, CobblerUnavailable),
])
def test_http_status(status: int, expected: type[CobblerError]) -> None:
    error = answering(status)
    assert type(error) is expected
    assert f"answered HTTP {status} " in str(error) and "during login" in str(error)
    assert (error.operation, error.status) == ("login", status)
    assert "127.0.0.1:" in str(error)


@pytest.mark.parametrize("body", [b"<html><body>Bad gateway</body></html",  # not well-formed
                                  b"Service restarting",
                                  b"<?xml version='1.0'?><html></html>"])  # XML, not XML-RPC
def test_body_that_is_not_xmlrpc(body: bytes) -> None:
    error = answering(200, body)
    assert type(error) is CobblerError  # not retried: the URL points at something else
    assert "answered login with a body that is not XML-RPC" in str(error)


def test_connection_refused() -> None:
    url = refused_url()
    error = login_error(url)
    assert type(error) is CobblerUnavailable
    assert str(error).startswith(f"Cobbler at {url} unreachable during login: ")
    assert "Connection refused" in str(error)


def test_connection_reset() -> None:
    with resetting_url() as url:
        error = login_error(url)
    assert type(error) is CobblerUnavailable
    assert f"Cobbler at {url} unreachable during login" in str(error)


def test_read_timeout_uses_the_client_timeout() -> None:
    with silent_url() as url:
        started = time.monotonic()
        error = login_error(url)
        waited = time.monotonic() - started
    assert type(error) is CobblerUnavailable and "timed out" in str(error)
    assert TIMEOUT <= waited < TIMEOUT + 1.5
