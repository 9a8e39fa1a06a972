"""One retry layer per outside call (docs/reliability.md, "Retries and timeouts"), reached for real:
the ERP call's Prefect task retries against a local HTTP server, virt.start's tenacity loop
against a scripted Salt master. Delays are set through the tasks' own options, nothing patched."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prefect import flow

from store_rollout.inventory import Store, parse_inventory
from tasks.erp import ERP_RETRIES, ErpUnavailable, notify_erp
from tasks.salt import SaltCommandFailed, SaltMinionNoResponse
from tasks.virt import VmError, VmNotRunning, start_domain
from tests.helpers import BASE_ENV

STORE = parse_inventory({"stores": [{
    "store_id": "0042", "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01"},
    "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
    "erp": {"site_code": "DE-0042"}}]}).stores[0]
VM = {"domain": "store-0042-vm", "uuid": "6f1c0d2e-0000-4000-8000-000000000042"}


class ScriptedErp:
    """An ERP on 127.0.0.1 that answers the statuses of `script` in turn, then 201 with an id."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, str]] = []
        erp = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                erp.requests.append({"path": self.path, "key": self.headers["Idempotency-Key"]})
                status = erp.script.pop(0) if erp.script else 201
                body = json.dumps({"id": "erp-1"} if status < 300 else {"error": "no"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def erp_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Settings (env) of a non-lab run whose ERP is a ScriptedErp; yields its factory."""
    made: list[ScriptedErp] = []
    monkeypatch.delenv("STORE_ROLLOUT_SETTINGS_FILE", raising=False)
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)

    def make(script: list[int]) -> ScriptedErp:
        erp = ScriptedErp(script)
        monkeypatch.setenv("STORE_ROLLOUT_ERP_URL", erp.url)
        monkeypatch.setenv("STORE_ROLLOUT_ERP_TIMEOUT_SECONDS", "5")
        made.append(erp)
        return erp

    yield make
    for erp in made:
        erp.close()


@flow(name="notify-erp-only")
def notify_only(store: Store, vm: dict[str, Any]) -> dict[str, Any]:
    # the production task with its production retries and retry condition; only no waiting
    return notify_erp.with_options(retry_delay_seconds=0)(store, vm)


@pytest.mark.parametrize("status", [503, 429])
def test_erp_transient_answers_are_retried_by_the_task_alone(
        prefect_harness: None, erp_with: Any, status: int) -> None:
    erp = erp_with([status] * ERP_RETRIES)  # fails every attempt but the last
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["erp_id"] == "erp-1"
    # exactly one POST per task attempt: no transport retries underneath
    assert len(erp.requests) == ERP_RETRIES + 1
    assert len({r["key"] for r in erp.requests}) == 1  # every retry is the same notice


def test_erp_gives_up_after_the_tasks_attempts(prefect_harness: None, erp_with: Any) -> None:
    erp = erp_with([503] * (ERP_RETRIES + 1))
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_failed()
    with pytest.raises(ErpUnavailable, match="HTTP 503"):
        state.result()
    assert len(erp.requests) == ERP_RETRIES + 1


def test_erp_4xx_is_not_retried(prefect_harness: None, erp_with: Any) -> None:
    erp = erp_with([400])
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_failed() and "HTTP 400" in str(state.message)
    assert len(erp.requests) == 1


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
