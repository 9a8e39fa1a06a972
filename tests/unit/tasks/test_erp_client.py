"""ErpClient maps the ERP's answers and transport failures to the ErpError tree.

A scripted ERP (http.server) on 127.0.0.1 records every request it receives.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import SecretStr
from requests.adapters import HTTPAdapter

from tasks.erp import NOTICE_PATH, ErpClient, ErpError, ErpNotice, ErpRejected, ErpUnavailable
from tests.local_servers import (
    ERP_CREATED,
    ScriptedErp,
    refused_url,
    resetting_url,
    serving,
    silent_url,
)

TOKEN = "erp-T0ken-do-not-log"
NOTICE = ErpNotice(store_id="0042", site_code="S-42", cost_center=None, hypervisor="store-0042-hv",
                   vm_domain="store-0042-vm", vm_minion="store-0042-vm", vm_uuid="u-1")


def client_for(url: str) -> ErpClient:
    return ErpClient(base_url=url, token=SecretStr(TOKEN), timeout=(0.5, 0.5))


@pytest.fixture
def erp() -> Iterator[tuple[ScriptedErp, ErpClient]]:
    server = ScriptedErp()
    with serving(server) as url:
        yield server, client_for(url)


@pytest.fixture
def requests_per_failed_notice(erp: tuple[ScriptedErp, ErpClient]) -> int:
    """How many requests one notify() sends to an ERP that keeps answering 503 (or 429).

    The session's adapter is requests' default (no retries): one request per call; the
    notify_erp task's Prefect retries are the one retry layer (tests/unit/tasks/test_erp_task.py).
    THE one place to update when the retry layering changes."""
    _, client = erp
    adapter = client.session.get_adapter(client.base_url)
    assert isinstance(adapter, HTTPAdapter)
    retry = adapter.max_retries
    return 1 + min(n for n in (retry.total, retry.status) if n is not None)


def error_of(client: ErpClient) -> ErpError:
    with pytest.raises(ErpError) as info:
        client.notify(NOTICE)
    assert TOKEN not in str(info.value)
    return info.value


def test_created(erp: tuple[ScriptedErp, ErpClient]) -> None:
    server, client = erp
    assert client.notify(NOTICE) == {"erp_id": "ERP-7", "replay": False, "status": 201,
                                     "idempotency_key": NOTICE.idempotency_key()}
    [request] = server.received
    assert request["path"] == NOTICE_PATH and request["json"] == NOTICE.payload()
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["Idempotency-Key"] == NOTICE.idempotency_key()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_4xx_is_rejected_once_without_the_token(erp: tuple[ScriptedErp, ErpClient],
                                                status: int) -> None:
    server, client = erp
    server.script = [(status, f"bad request with Authorization: Bearer {TOKEN}".encode())]
    error = error_of(client)
    assert type(error) is ErpRejected
    assert f"for store 0042: HTTP {status} bad request with Authorization: Bearer ***" in str(error)
    assert (error.operation, error.subject, error.status) == ("POST", "0042", status)
    assert len(server.received) == 1  # not retried


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_busy_or_5xx_is_unavailable_after_the_retries(
        erp: tuple[ScriptedErp, ErpClient], requests_per_failed_notice: int, status: int) -> None:
    server, client = erp
    server.script = [(status, b"try later")]
    error = error_of(client)
    assert type(error) is ErpUnavailable
    assert str(error) == f"ERP POST {client.base_url}{NOTICE_PATH} for store 0042: HTTP {status}"
    assert (error.operation, error.subject, error.status) == ("POST", "0042", status)
    assert len(server.received) == requests_per_failed_notice


def test_idempotency_key_is_stable_across_retries(erp: tuple[ScriptedErp, ErpClient],
                                                  requests_per_failed_notice: int) -> None:
    server, client = erp
    server.script = [(503, b""), (503, b""), ERP_CREATED]
    for _ in range(2):  # two task attempts that fail, as notify_erp's Prefect retries make them
        assert type(error_of(client)) is ErpUnavailable
    assert client.notify(NOTICE)["erp_id"] == "ERP-7"
    client.notify(NOTICE)  # a rerun: a second call for the same store and VM
    keys = {r["headers"]["Idempotency-Key"] for r in server.received}
    assert len(server.received) == 2 * requests_per_failed_notice + 2
    assert keys == {NOTICE.idempotency_key()}
    other_vm = ErpNotice(**{**NOTICE.__dict__, "vm_uuid": "u-2"})
    assert other_vm.idempotency_key() != NOTICE.idempotency_key()


@pytest.mark.parametrize("answer", [b"<html>created</html>", b"[1, 2]", b'{"replay": false}'])
def test_2xx_without_a_json_id_is_an_erp_error(erp: tuple[ScriptedErp, ErpClient],
                                               answer: bytes) -> None:
    server, client = erp
    server.script = [(201, answer)]
    error = error_of(client)
    assert type(error) is ErpError
    assert "for store 0042: HTTP 201 without a JSON object with an id" in str(error)
    assert (error.operation, error.subject, error.status) == ("POST", "0042", 201)


def test_connection_refused() -> None:
    url = refused_url()
    error = error_of(client_for(url))
    assert type(error) is ErpUnavailable
    assert str(error) == f"ERP POST {url}{NOTICE_PATH} for store 0042 failed: ConnectionError"


def test_connection_reset() -> None:
    with resetting_url() as url:
        error = error_of(client_for(url))
    assert type(error) is ErpUnavailable and "for store 0042 failed: ConnectionError" in str(error)


def test_read_timeout_uses_the_client_timeout() -> None:
    with silent_url() as url:
        started = time.monotonic()
        error = error_of(client_for(url))
        waited = time.monotonic() - started
    assert type(error) is ErpUnavailable
    # requests' default adapter (no retries) raises the read timeout as ReadTimeout
    assert str(error) == f"ERP POST {url}{NOTICE_PATH} for store 0042 failed: ReadTimeout"
    assert 0.5 <= waited < 2.0  # timeout=(0.5, 0.5): not the default 15 s read timeout


def test_notices_read_back_what_the_lab_erp_holds(tmp_path: Any) -> None:
    """ErpClient.notices against the lab's ERP (lab/erp_receiver.py): the notices of one store,
    a replay not counted twice, another store's not listed, reads not logged, the token needed."""
    from lab.erp_receiver import ErpState, make_handler

    (tmp_path / "tokens").write_text(TOKEN + "\n")
    log = tmp_path / "requests.jsonl"
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 make_handler(ErpState(log, tmp_path / "tokens")))
    with serving(server) as url:
        client = client_for(url)
        assert client.notices("0042") == []
        first = client.notify(NOTICE)
        assert client.notify(NOTICE)["replay"] is True
        client.notify(ErpNotice(**{**NOTICE.__dict__, "store_id": "0043"}))
        logged = log.read_text()
        notices = client.notices("0042")
        assert [(n["id"], n["idempotency_key"], n["vm_uuid"]) for n in notices] == [
            (first["erp_id"], NOTICE.idempotency_key(), "u-1")]
        assert log.read_text() == logged  # reads are not notices
        with pytest.raises(ErpRejected, match="HTTP 401"):
            ErpClient(base_url=url, token=SecretStr("wrong"), timeout=(0.5, 0.5)).notices("0042")
    # a restarted ERP still lists what its log holds
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 make_handler(ErpState(log, tmp_path / "tokens")))
    with serving(server) as url:
        assert [n["id"] for n in client_for(url).notices("0042")] == [first["erp_id"]]


def test_notices_of_an_erp_without_the_read_api_fail_with_its_status(
        erp: tuple[ScriptedErp, ErpClient]) -> None:
    server, client = erp
    with pytest.raises(ErpUnavailable, match="HTTP 501"):  # http.server: no do_GET
        client.notices("0042")
