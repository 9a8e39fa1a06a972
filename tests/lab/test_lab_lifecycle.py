"""Issue 2: `lab up` is idempotent and repairs a crashed lab; `lab down` leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

import psutil
import pytest

from lab.manager import Lab
from lab.state import REPO_ROOT
from lab.store_network import StoreNetwork
from tests.helpers import wait_for

pytestmark = pytest.mark.lab

WATCHED = [Path("/etc"), Path("/var/lib/libvirt"), Path("/srv"), Path("/run/libvirt")]
MAX_IDLE_RSS = 2 * 2**30


def snapshot() -> dict[str, tuple[int, int, int]]:
    """(size, mtime_ns, mode) of every entry under the watched trees."""
    seen: dict[str, tuple[int, int, int]] = {}
    for top in WATCHED:
        if not top.exists():
            seen[str(top)] = (-1, -1, -1)
            continue
        for root, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                seen[path] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return seen


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (the lab's daemons are this test's children)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def host_links() -> list[str]:
    return sorted(name for _index, name in socket.if_nameindex())


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'])[:120]}")
        except psutil.Error:
            continue
    return found


@pytest.fixture
def lifecycle_dir() -> Path:
    path = REPO_ROOT / ".lab-test-lifecycle"
    if path.exists():
        Lab.at(path).down()
        shutil.rmtree(path)
    return path


def test_lab_up_idempotent_recovers_and_down_leaves_nothing(lifecycle_dir: Path) -> None:
    before, links_before = snapshot(), host_links()
    lab = Lab.at(lifecycle_dir)
    try:
        info = lab.up()
        pids = {name: svc.pid for name, svc in info.services.items()}
        assert set(pids) == {"store-network", "postgres", "prefect-server", "salt-master",
                             "libvirtd", "cobblerd", "cobbler-http", "cobbler-dnsmasq",
                             "erp-receiver", "webhook-receiver",
                             "image-server", "vbmcd", "redfish-bmc", "simulator",
                             "prefect-worker", "backup-server"}
        rows = lab.status()
        assert all(r["alive"] for r in rows)
        total = sum(r["rss_bytes"] for r in rows)
        print(f"idle lab RSS: {total / 2**20:.0f} MiB")
        assert total <= MAX_IDLE_RSS

        # idempotent: a second `up` keeps every running service
        again = Lab.at(lifecycle_dir).up()
        assert {n: s.pid for n, s in again.services.items()} == pids

        # crash: kill three daemons hard; `up` restarts exactly those, and with the store
        # network the simulator (its machines' links died with the old gateway), libvirtd and
        # Cobbler's dnsmasq (which run on that network; dnsmasq in cobblerd's namespace too)
        for name in ("salt-master", "cobblerd", "store-network"):
            os.killpg(pids[name], signal.SIGKILL)
        wait_for(lambda: all(gone(pids[name]) for name in ("salt-master", "cobblerd", "store-network")),
                 timeout=10, what="the killed daemons to be gone")
        repaired = Lab.at(lifecycle_dir).up()
        new_pids = {n: s.pid for n, s in repaired.services.items()}
        restarted = {name for name in pids if new_pids[name] != pids[name]}
        assert restarted == {"salt-master", "cobblerd", "cobbler-http", "store-network",
                             "simulator", "libvirtd", "cobbler-dnsmasq"}
        dnsmasq = Path(f"/proc/{new_pids['cobbler-dnsmasq']}")
        assert os.stat(dnsmasq / "ns" / "mnt").st_ino == \
            os.stat(f"/proc/{new_pids['cobblerd']}/ns/mnt").st_ino
        assert os.stat(dnsmasq / "ns" / "net").st_ino == \
            StoreNetwork.load(Path(repaired.store_network_state)).netns_inode
        network = StoreNetwork.load(Path(repaired.store_network_state))
        assert network.pid == new_pids["store-network"]
        assert os.stat(f"/proc/{new_pids['libvirtd']}/ns/net").st_ino == network.netns_inode
        assert all(r["alive"] for r in Lab.at(lifecycle_dir).status())
    finally:
        Lab.at(lifecycle_dir).down()

    wait_for(lambda: not processes_mentioning(str(lifecycle_dir)), timeout=10,
             what=f"every process of the lab {lifecycle_dir} to exit")
    assert all(gone(pid) for pid in {**pids, **new_pids}.values())
    assert host_links() == links_before  # the store network never touched the host's
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(lifecycle_dir) not in mounts
    after = snapshot()
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert changed == [], f"lab changed the host: {changed[:10]}"
    shutil.rmtree(lifecycle_dir)
