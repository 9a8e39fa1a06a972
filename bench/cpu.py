"""CPU seconds of the lab's processes, grouped as the control plane (what production runs per
fleet) or the simulated hardware (what production does not run at all), for cost per store.

Each lab service is the tree of processes under the PID the lab recorded for it; a process
counts its own user+system time and that of its children it already reaped (cutime/cstime),
so minions restarted by a simulated reboot are not lost. QEMU, which libvirtd daemonizes
away from its tree, is found by its command line naming the lab's state dir.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from lab.state import LabInfo

CLK_TCK = os.sysconf("SC_CLK_TCK")
# what a production fleet runs per store, against what only the lab's stand-in hardware costs
CONTROL_PLANE = ("prefect-server", "postgres", "salt-master", "cobblerd", "cobbler-http",
                 "flow-runner")
SIMULATED_HARDWARE = ("simulator", "libvirtd", "qemu", "store-network")
OUTSIDE_STAND_INS = ("erp-receiver", "image-server", "prefect-worker")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children), None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / CLK_TCK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds so far of these processes and of their reaped children (a gone one: 0)."""
    return sum(stat[1] for pid in pids if (stat := _stat(pid)) is not None)


def snapshot(info: LabInfo, runner_pid: int | None = None,
             apart: Mapping[str, int] | None = None) -> dict[str, float]:
    """CPU seconds so far of each lab service's process tree, of the lab's QEMUs, and of the
    process that runs the flows (`runner_pid`, default this one) as "flow-runner". `apart`
    ({name: pid}): trees counted under their own name even when they are the runner's children
    (a bench's own simulated minions)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            stats[int(entry)] = stat
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _cpu) in stats.items():
        children[ppid].append(pid)

    def tree(root: int) -> set[int]:
        found, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid in stats and pid not in found:
                found.add(pid)
                todo.extend(children[pid])
        return found

    roots = {name: svc.pid for name, svc in info.services.items()}
    roots.update(apart or {})  # claimed before the runner's tree, which may hold them
    roots["flow-runner"] = runner_pid or os.getpid()
    seconds: dict[str, float] = {}
    claimed: set[int] = set()
    for name, root in roots.items():
        pids = tree(root) - claimed
        claimed |= pids
        seconds[name] = sum(stats[pid][1] for pid in pids)
    qemu = {pid for pid in stats if pid not in claimed and "qemu-system" in _cmdline(pid)
            and info.state_dir in _cmdline(pid)}
    seconds["qemu"] = sum(stats[pid][1] for pid in qemu)
    return seconds


def per_store(before: dict[str, float], after: dict[str, float], stores: int) -> dict[str, object]:
    """CPU seconds per store of each process group between two snapshots, and the totals of the
    control plane and of the simulated hardware. A process that was replaced between the
    snapshots (a restarted service) counts from zero."""
    def used(name: str) -> float:
        start, end = before.get(name, 0.0), after[name]
        return end if end < start else end - start

    delta = {name: used(name) for name in after}
    per = {name: round(value / stores, 3) for name, value in sorted(delta.items())}
    return {"per_store_cpu_seconds": per,
            "control_plane_per_store": round(sum(per.get(n, 0.0) for n in CONTROL_PLANE), 3),
            "simulated_hardware_per_store": round(
                sum(per.get(n, 0.0) for n in SIMULATED_HARDWARE), 3),
            "outside_stand_ins_per_store": round(
                sum(per.get(n, 0.0) for n in OUTSIDE_STAND_INS), 3)}
