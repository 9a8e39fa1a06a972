"""plan's and reconcile's Cobbler and ERP reads, a few stores at a time, each thread with its
own clients (tasks/outside_reads.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from store_rollout.inventory import load_inventory
from store_rollout.settings_parts import CobblerSettings, ErpSettings, HostSettings, SaltSettings
from tasks import outside_reads
from tasks.cobbler import CobblerError
from tasks.erp import ErpError
from tests.helpers import settings_with, write_inventory


class Clients:
    """Stand-ins for one thread's Cobbler and ERP clients, counting who reads at once."""

    made: list[int] = []
    closed = 0
    at_once = 0
    most = 0
    lock = threading.Lock()

    def __init__(self) -> None:
        Clients.made.append(threading.get_ident())
        self.owner = threading.get_ident()

    def _read(self) -> None:
        assert threading.get_ident() == self.owner  # never shared between threads
        with Clients.lock:
            Clients.at_once += 1
            Clients.most = max(Clients.most, Clients.at_once)
        time.sleep(0.02)  # a request's round trip
        with Clients.lock:
            Clients.at_once -= 1

    def close(self) -> None:
        with Clients.lock:
            Clients.closed += 1

    def get_system(self, name: str) -> dict[str, Any] | None:
        self._read()
        if name == "store-bad-hv":
            raise CobblerError("connection refused")
        return None

    def notices(self, store_id: str) -> list[dict[str, Any]]:
        self._read()
        if store_id.endswith("7"):
            raise ErpError("ERP answered 503")
        return [{"id": f"E-{store_id}"}]


def read(tmp_path: Path, ids: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(outside_reads, "cobbler_client", lambda _s: Clients())
    monkeypatch.setattr(outside_reads, "erp_client", lambda _s: Clients())
    settings = settings_with()
    path = write_inventory(tmp_path / "inventory.yaml", ids, "52:54:00:3c:00")
    stores = load_inventory(str(path)).stores
    return outside_reads.read_outside(stores, CobblerSettings.of(settings),
                                      ErpSettings.of(settings), SaltSettings.of(settings),
                                      HostSettings.of(settings))


def test_every_store_read_some_at_once_with_clients_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Clients.made, Clients.most, Clients.closed = [], 0, 0
    ids = [f"{i:04d}" for i in range(40)]
    found = read(tmp_path, ids, monkeypatch)
    assert list(found) == ids
    assert found["0001"].notices == [{"id": "E-0001"}] and found["0001"].erp_error is None
    assert found["0007"].notices == [] and "503" in str(found["0007"].erp_error)
    assert found["0001"].record is None
    assert 1 < Clients.most <= outside_reads.READS_AT_ONCE  # 40 stores, not one after another
    assert len(Clients.made) <= 2 * outside_reads.READS_AT_ONCE  # a pair per thread, not per store
    assert Clients.closed == len(Clients.made)  # each thread's connections closed at the end


def test_a_cobbler_error_fails_the_read_naming_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CobblerError, match="store bad: reading Cobbler system store-bad-hv"):
        read(tmp_path, ["0001", "bad"], monkeypatch)


def test_the_first_cobbler_failure_stops_the_stores_not_yet_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Cobbler that fails (or hangs to its timeout) is named after about one round of reads,
    not after every store of the region has tried it too (review)."""
    Clients.made, Clients.closed = [], 0
    asked: list[str] = []

    class Failing(Clients):
        def get_system(self, name: str) -> dict[str, Any] | None:
            asked.append(name)
            time.sleep(0.01)
            raise CobblerError("timed out")

    monkeypatch.setattr(outside_reads, "cobbler_client", lambda _s: Failing())
    monkeypatch.setattr(outside_reads, "erp_client", lambda _s: Clients())
    settings = settings_with()
    ids = [f"{i:04d}" for i in range(200)]
    path = write_inventory(tmp_path / "inventory.yaml", ids, "52:54:00:3f:00")
    stores = load_inventory(str(path)).stores
    with pytest.raises(CobblerError, match="store 0000: reading Cobbler system"):
        outside_reads.read_outside(stores, CobblerSettings.of(settings), ErpSettings.of(settings),
                                   SaltSettings.of(settings), HostSettings.of(settings))
    assert len(asked) <= 2 * outside_reads.READS_AT_ONCE  # not 200
    assert Clients.closed == len(Clients.made) > 0  # closed after a failure too
