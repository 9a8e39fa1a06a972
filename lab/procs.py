"""Process plumbing for the lab: start daemons in their own process group, stop them by PID.

The lab never looks processes up by name: everything it stops is a PID it recorded itself,
and it checks the recorded start time so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessRecord:
    """A process the lab started: its PID and kernel start time (guards against PID reuse)."""

    pid: int
    create_time: float

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.create_time) < 0.05
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False

    def to_json(self) -> dict[str, float | int]:
        return {"pid": self.pid, "create_time": self.create_time}

    @classmethod
    def from_json(cls, data: Mapping[str, float | int]) -> ProcessRecord:
        return cls(pid=int(data["pid"]), create_time=float(data["create_time"]))


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
    pass_fds: Sequence[int] = (),
) -> ProcessRecord:
    """Start a daemon in a new session (its own process group), output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            user=user,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    return ProcessRecord(proc.pid, psutil.Process(proc.pid).create_time())


def _live_members(pgids: set[int]) -> list[psutil.Process]:
    """Non-zombie processes in any of the groups, in one pass over /proc. A zombie is dead
    already, and one whose parent does not reap it (a daemon reparented to an init that does
    not reap) would hold every wait until its timeout."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) in pgids:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def stop(record: ProcessRecord, grace: float = 3.0) -> None:
    """SIGTERM the process group the record leads, wait `grace` seconds, then SIGKILL it."""
    stop_many([record], grace)


def stop_many(records: Sequence[ProcessRecord], grace: float = 3.0) -> None:
    """stop() for many process groups at once: one grace period for all of them.

    Every lab daemon leads its own session, so its PID is its process group id.
    """
    alive = [r for r in records if r.alive()]
    for record in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    groups = {r.pid for r in records}
    while time.monotonic() < deadline and _live_members(groups):
        time.sleep(0.1)
    leftovers = _live_members(groups)
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    # not psutil.wait_procs: a killed grandchild stays a zombie until an init that may reap
    # late (or never) does, and wait_procs counts a zombie as running (1-2 s a stop, seen here)
    deadline = time.monotonic() + 3
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.02)
        leftovers = _live_members(groups)
    for record in records:  # a leader this process spawned is our child: reap its zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, os.WNOHANG)


def tree_rss(record: ProcessRecord) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    if not record.alive():
        return 0
    root = psutil.Process(record.pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll a cheap local readiness probe; raises TimeoutError naming what was awaited."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # readiness probes fail until the daemon is up
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"lab: {what} not ready after {timeout:.0f}s (last error: {last_error!r})")


def listens_on(record: ProcessRecord, port: int) -> bool:
    """The recorded process (or a child of it) listens on TCP `port`."""
    if not record.alive():
        return False
    root = psutil.Process(record.pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            connections = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
               for conn in connections):
            return True
    return False
