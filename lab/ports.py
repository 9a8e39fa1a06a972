"""The lab's TCP ports on 127.0.0.1: chosen once per lab, so that no two labs and no outgoing
connection can hold one of them when its server starts.

Two labs run side by side (pytest-xdist gives each worker its own `.lab-test-gwN`), and each
used to take "a port free right now" from the kernel's ephemeral range. Both hazards are real:
two labs choosing before either listens can pick the same port, and a port of the ephemeral
range can be some client's source port by the time a lab (re)starts its server on it (both end
with a lab server that exits at start, its port held by a process the lab did not start). So a
lab's ports come from below the ephemeral range, which the kernel never hands to a client, and
are chosen under a lock on the labs' parent directory, skipping every port a sibling lab has
recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

# the lowest port a lab takes: above the registered services most machines run
LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_FILE = "ports.json"
# labs live side by side as `.lab` (`lab up`) and `.lab-*` (the tests' labs) in one directory
SIBLINGS = ".lab*"


def ephemeral_low(source: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (clients' source ports)."""
    try:
        return int(source.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def bindable(port: int) -> bool:
    """Nothing listens on, or holds, 127.0.0.1:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def labs_locked(parent: Path) -> Iterator[None]:
    """One lab at a time chooses ports among its siblings (a lock on their directory itself,
    so nothing is written outside the labs' own directories)."""
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def sibling_ports(root: Path) -> set[int]:
    """Every port another lab beside `root` has recorded (running or not: it may come back)."""
    taken: set[int] = set()
    for other in root.parent.glob(f"{SIBLINGS}/{PORTS_FILE}"):
        if other.parent.resolve() == root.resolve():
            continue
        with contextlib.suppress(OSError, ValueError, AttributeError):
            taken.update(value for value in json.loads(other.read_text()).values()
                         if isinstance(value, int) and value)
    return taken


def choose(names: Iterable[str], root: Path, kept: dict[str, int],
           rng: random.Random | None = None) -> dict[str, int]:
    """A port for each of `names` not in `kept` (a lab's ports from before stay as they were):
    below the ephemeral range, bindable now, and no sibling lab's or another name's. Call it
    inside `labs_locked(root.parent)` and record the result before leaving the lock."""
    rng = rng or random.SystemRandom()
    high = ephemeral_low()
    if high - LOWEST < 1000:
        raise RuntimeError(f"lab: the ephemeral port range ({EPHEMERAL_RANGE}) starts at {high}, "
                           f"leaving no room for the lab's ports between {LOWEST} and it")
    taken = sibling_ports(root) | {port for port in kept.values() if port}
    chosen = dict(kept)
    for name in names:
        if chosen.get(name):
            continue
        for _ in range(200):
            port = rng.randrange(LOWEST, high)
            if port not in taken and bindable(port):
                break
        else:
            raise RuntimeError(f"lab: no free port for {name} between {LOWEST} and {high}")
        taken.add(port)
        chosen[name] = port
    return chosen
