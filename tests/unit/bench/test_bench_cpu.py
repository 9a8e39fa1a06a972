"""bench/cpu.py: CPU seconds per lab service's process tree, reaped children included."""

from __future__ import annotations

import subprocess
import sys
import time

from lab.state import REPO_ROOT, LabInfo, ServiceInfo

sys.path.insert(0, str(REPO_ROOT / "bench"))
from cpu import cpu_seconds, per_store, snapshot  # noqa: E402

BURN = "import time\nend = time.process_time() + float(__import__('sys').argv[1])\n" \
       "while time.process_time() < end: pass\n"


def test_a_services_tree_and_its_reaped_children_are_counted() -> None:
    # a "service" whose child burns 0.5 s of CPU, then a grandchild that burns 0.5 s and is reaped
    service = subprocess.Popen([sys.executable, "-c",
                                "import subprocess, sys, time\n"
                                f"subprocess.run([sys.executable, '-c', {BURN!r}, '0.5'])\n"
                                "time.sleep(30)\n"])
    try:
        info = LabInfo.model_construct(state_dir="/nonexistent-lab", services={
            "salt-master": ServiceInfo(address="-", pid=service.pid, create_time=0, log="-")})
        before = {"salt-master": 0.0, "flow-runner": 0.0, "qemu": 0.0}
        deadline = time.monotonic() + 20
        while snapshot(info)["salt-master"] < 0.5 and time.monotonic() < deadline:
            time.sleep(0.2)
        after = snapshot(info)
        assert 0.5 <= after["salt-master"] < 2.0, after
        cost = per_store(before, after, stores=2)
        assert cost["per_store_cpu_seconds"]["salt-master"] == round(after["salt-master"] / 2, 3)
        assert cost["control_plane_per_store"] >= cost["per_store_cpu_seconds"]["salt-master"]
        assert cost["simulated_hardware_per_store"] == 0.0
    finally:
        service.kill()
        service.wait()


def test_a_tree_set_apart_is_not_counted_as_the_runners() -> None:
    """A bench's own simulated minions run as its child: counted under their own name, not in
    the flow runner's (the control plane's) seconds."""
    swarm = subprocess.Popen([sys.executable, "-c", BURN + "import time\ntime.sleep(30)\n", "0.5"])
    try:
        info = LabInfo.model_construct(state_dir="/nonexistent-lab", services={})
        deadline = time.monotonic() + 20
        while cpu_seconds([swarm.pid]) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.2)
        runner_alone = snapshot(info)["flow-runner"]
        split = snapshot(info, apart={"light-minions": swarm.pid})
        assert 0.5 <= split["light-minions"] < 2.0, split
        # the swarm is this process's child: without `apart` the runner's seconds hold it
        assert split["flow-runner"] <= runner_alone - 0.5 + 0.1, (split, runner_alone)
        assert cpu_seconds([swarm.pid, 2**22 + 1]) == split["light-minions"]  # a gone pid: 0
    finally:
        swarm.kill()
        swarm.wait()
