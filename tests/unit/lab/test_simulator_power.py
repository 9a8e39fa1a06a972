"""The simulator's power actions: one machine's slow power-off never holds up another's.

Ten VMs rebooting at once used to wait for each other behind one lock (each stop up to a few
seconds: SIGTERM, grace, SIGKILL), so their minions came back in clumps, 15-30 s late.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

from lab.procs import spawn
from lab.simulator.minions import MinionManager, clear_stale_pidfiles
from lab.state import LabInfo, LabPaths


def test_a_quick_power_off_finishes_while_a_slow_one_is_still_waiting(tmp_path: Path) -> None:
    paths = LabPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    minions = MinionManager(paths, LabInfo.model_construct(state_dir=str(tmp_path)))
    # "slow" ignores SIGTERM, so its stop waits out the whole grace period; "quick" ends at once
    minions.procs["slow"] = spawn(["sh", "-c", "trap '' TERM; sleep 60 & wait"],
                                  paths.logs / "slow.log")
    minions.procs["quick"] = spawn(["sleep", "60"], paths.logs / "quick.log")
    slow_record = minions.procs["slow"]
    try:
        slow = threading.Thread(target=minions.stop, args=("slow", "test", 5.0))
        slow.start()
        while "slow" in minions.procs:  # its stop has begun
            slow.join(0.01)
        minions.stop("quick", "test")
        assert slow.is_alive(), "the quick stop should not have waited for the slow one"
        assert [e["minion"] for e in minions.history if e["event"] == "stop"] == ["quick"]
        slow.join()
        assert not slow_record.alive()
        assert [e["minion"] for e in minions.history] == ["quick", "slow"]
    finally:
        minions.stop("slow", grace=0)
        minions.stop("quick", grace=0)


def test_a_booting_machine_drops_pidfiles_of_dead_minions_only(tmp_path: Path) -> None:
    """A reboot kills the minion at once; its zombie may outlive the kill until init reaps it,
    and a pidfile naming it made the next minion exit as "already running"."""
    zombie = subprocess.Popen(["true"])  # not reaped until the end: a zombie meanwhile
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        gone = subprocess.Popen(["true"])
        gone.wait()
        (tmp_path / "salt-minion.pid").write_text(f"{zombie.pid}\n")
        (tmp_path / "process_responsibility_salt-minion.pid").write_text(
            json.dumps({"pid": gone.pid, "name": "salt-minion"}))
        (tmp_path / "garbled.pid").write_text("not a pid")
        (tmp_path / "live.pid").write_text(str(os.getpid()))  # a minion still running
        clear_stale_pidfiles(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["live.pid"]
    finally:
        zombie.wait()
