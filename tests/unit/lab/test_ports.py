"""A lab's ports (lab/ports.py): never the kernel's ephemeral ports, never a sibling lab's, and a
lab server is only taken for ready when the process the lab started is the one listening.

CI once failed 49 lab tests at setup with "image-server exited after start": the two xdist
workers' labs had chosen their ports from the ephemeral range, each "free right now", and one
lab's image server found its port held when it started, while the health check was answered by
a server of the other lab.
"""

from __future__ import annotations

import random
import socket
import sys
import threading
from pathlib import Path

import pytest

from lab import ports
from lab.procs import listens_on, spawn, stop, wait_until
from lab.state import LabPaths, LabPorts


def test_a_labs_ports_lie_below_the_ephemeral_range(tmp_path: Path) -> None:
    """No client's source port can hold a lab port when its server (re)starts."""
    chosen = LabPaths(tmp_path / ".lab-test-gw0").load_or_create_ports().model_dump().values()
    low = ports.ephemeral_low()
    assert all(ports.LOWEST <= port < low for port in chosen), (sorted(chosen), low)
    assert len(set(chosen)) == len(LabPorts.model_fields)


def test_two_labs_choosing_at_once_share_no_port(tmp_path: Path) -> None:
    results: dict[str, set[int]] = {}

    def choose(name: str) -> None:
        results[name] = set(LabPaths(tmp_path / name).load_or_create_ports().model_dump().values())

    workers = [threading.Thread(target=choose, args=(f".lab-test-gw{n}",)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    everything = [port for chosen in results.values() for port in chosen]
    assert len(results) == 4 and len(everything) == len(set(everything))


class Scripted(random.Random):
    """Offers the given ports first, then any."""

    def __init__(self, first: list[int]) -> None:
        super().__init__(7)
        self.first = list(first)

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return self.first.pop(0) if self.first else super().randrange(start, stop, step)


def test_a_port_a_sibling_lab_recorded_is_skipped_even_while_it_is_down(tmp_path: Path) -> None:
    sibling = LabPaths(tmp_path / ".lab").load_or_create_ports()  # recorded, nothing listens
    ours = tmp_path / ".lab-test"
    ours.mkdir()
    got = ports.choose(["postgres"], ours, {}, rng=Scripted([sibling.prefect]))
    assert got["postgres"] != sibling.prefect


def test_a_port_something_listens_on_is_skipped(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        got = ports.choose(["erp"], tmp_path, {}, rng=Scripted([port]))
    assert got["erp"] != port


def test_ports_recorded_before_are_kept(tmp_path: Path) -> None:
    got = ports.choose(["erp", "webhook"], tmp_path, {"erp": 41234, "webhook": 0})
    assert got["erp"] == 41234 and got["webhook"] not in (0, 41234)


def test_no_room_below_the_ephemeral_range_is_said(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.LOWEST + 10)
    with pytest.raises(RuntimeError, match="ephemeral port range"):
        ports.choose(["erp"], tmp_path, {})


def test_a_server_counts_as_the_labs_only_when_its_own_process_listens(tmp_path: Path) -> None:
    """Another process answering on the port (another lab's server) is not our server."""
    port = ports.choose(["x"], tmp_path, {})["x"]
    server = spawn([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                   tmp_path / "server.log", cwd=tmp_path)
    bystander = spawn([sys.executable, "-c", "import time; time.sleep(60)"],
                      tmp_path / "bystander.log")
    try:
        wait_until(lambda: listens_on(server, port), 20, "http.server")
        assert not listens_on(bystander, port)
        assert not listens_on(server, port + 1)
    finally:
        stop(server)
        stop(bystander)
    assert not listens_on(server, port)
