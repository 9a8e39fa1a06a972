"""Store boxes racked with a libvirtd of their own (issue 48): what the simulator runs while such
a box's installed OS is up, and where it keeps it.

A box racked `own_libvirt` (lab.hardware.rack) has a dir `<lab>/boxes/<system>/` holding its
marker (`own-libvirt.json`), its libvirtd's state (lab/box_libvirt.py: config, sockets, the
namespace's /etc and /var/lib/libvirt), its VM images (`images/`, which the box's libvirtd and
its minion see at the lab's common VM images path, as two real hosts both have
/srv/salt-images) and its libvirt PKI (`pki/`, /etc/pki inside its libvirtd's namespace).

While its OS runs the box has three processes, recorded by PID in `processes.json`:
- `netns`: the holder of the box's network namespace, on the store network with the box's
  address (a `sleep` under lab/host_namespace.py): the box's minion and libvirtd both join it,
  so a minion restart never takes libvirtd's network away;
- `libvirtd`: the box's libvirtd (TLS on the box's address);
- the box's minion (lab/simulator/minions.py records it as any machine's).
A power cut (`power_cut`) destroys the box's domains, stops its libvirtd, kills the QEMU left
by PID (their pidfiles in the namespace's /run) and ends the holder; `lab down` does it for
every box.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from lab import box_libvirt
from lab.procs import ProcessRecord, spawn, stop, wait_until
from lab.store_network import StoreNetwork

BOXES_DIR = "boxes"
MARKER = "own-libvirt.json"
PROCESSES = "processes.json"
HOST_NAMESPACE = Path(__file__).resolve().parent / "host_namespace.py"
UNIX_PATH_MAX = 107


@dataclass(frozen=True)
class Box:
    """A box with its own libvirtd: `dir` is its state, `common_images` the lab's common VM
    images path (LabInfo.vm_images_dir) that its images dir stands in for."""

    name: str
    dir: Path
    common_images: Path
    # its VM images, its libvirt PKI (/etc/pki in its libvirtd's namespace), its sockets
    images: Path = field(init=False)
    pki: Path = field(init=False)
    sock_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        for attr, sub in (("images", "images"), ("pki", "pki"), ("sock_dir", "sock")):
            object.__setattr__(self, attr, self.dir / sub)

    @property
    def uri(self) -> str:
        return box_libvirt.uri(self.dir)

    @property
    def store_id(self) -> str:
        return str(json.loads((self.dir / MARKER).read_text())["store_id"])

    def local(self, path: Path | str) -> Path:
        """A path as the box's libvirtd names it (under the common images path), as the lab's
        own namespace reaches it (under the box's images dir); any other path as it is."""
        path = Path(path)
        if path.is_relative_to(self.common_images):
            return self.images / path.relative_to(self.common_images)
        return path

    def common(self, path: Path | str) -> Path:
        """The inverse of `local`."""
        path = Path(path)
        if path.is_relative_to(self.images):
            return self.common_images / path.relative_to(self.images)
        return path

    def processes(self) -> dict[str, Any]:
        file = self.dir / PROCESSES
        try:
            data: dict[str, Any] = json.loads(file.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def record(self, which: str) -> ProcessRecord | None:
        data = self.processes().get(which)
        return ProcessRecord.from_json(data) if isinstance(data, dict) else None

    def running(self) -> bool:
        """Its holder and its libvirtd both alive."""
        records = [self.record("netns"), self.record("libvirtd")]
        return all(r is not None and r.alive() for r in records)


def box_dir(state_dir: Path | str, name: str) -> Path:
    return Path(state_dir) / BOXES_DIR / name


def own_box(state_dir: Path | str, name: str, common_images: Path | str) -> Box | None:
    """The box `name` when it was racked with its own libvirtd, else None."""
    path = box_dir(state_dir, name)
    if not (path / MARKER).exists():
        return None
    return Box(name, path, Path(common_images))


def mark(state_dir: Path | str, name: str, store_id: str) -> Box:
    """Rack `name` with its own libvirtd (idempotent); its socket paths must fit the kernel's
    limit (a deep state dir cannot hold one)."""
    path = box_dir(state_dir, name)
    longest = len(str(path / "sock" / "libvirt-admin-sock"))
    if longest > UNIX_PATH_MAX:
        raise ValueError(f"lab state dir {state_dir} is too deep for box {name}'s libvirtd "
                         f"socket ({longest} characters, the kernel allows {UNIX_PATH_MAX}); "
                         "use a shorter --state-dir")
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text(json.dumps({"store_id": store_id, "name": name}))
    return Box(name, path, Path(state_dir) / "libvirt" / "images")


def all_boxes(state_dir: Path | str, common_images: Path | str) -> list[Box]:
    base = Path(state_dir) / BOXES_DIR
    return [Box(p.parent.name, p.parent, Path(common_images))
            for p in sorted(base.glob(f"*/{MARKER}"))] if base.is_dir() else []


def _write_processes(box: Box, data: dict[str, Any]) -> None:
    tmp = box.dir / f"{PROCESSES}.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(box.dir / PROCESSES)


def _has_address(pid: int, address: str) -> bool:
    proc = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "-4", "addr",
                           "show", "dev", "eth0"], capture_output=True, text=True, check=False)
    return f" {address}/" in proc.stdout


def power_on(box: Box, *, network: StoreNetwork, minion_id: str, address: str,
             simulator_url: str, logs: Path) -> bool:
    """The box's OS boots: its network namespace on the store network at `address` (the
    address of its minion `minion_id`), then its libvirtd there. True when it started them,
    False when they ran already."""
    if box.running():
        return False
    power_cut(box)  # whatever is left of a half-started box
    # a boot empties /run: libvirtd then autostarts its domains as at a host's boot
    shutil.rmtree(box.dir / "ns" / "run", ignore_errors=True)
    holder = spawn(["unshare", "--net", "--", sys.executable, str(HOST_NAMESPACE),
                    *network.join_args(minion_id, address), "--", "sleep", "infinity"],
                   logs / f"box-{box.name}-netns.log")
    data: dict[str, Any] = {"netns": holder.to_json(), "minion_id": minion_id,
                            "address": address}
    _write_processes(box, data)
    wait_until(lambda: _has_address(holder.pid, address), 30,
               f"box {box.name}'s network namespace at {address}", interval=0.1)
    box_libvirt.prepare(box.dir, box_name=box.name, store_id=box.store_id, address=address,
                        images_dir=box.images, common_images=box.common_images,
                        pki_dir=box.pki, simulator_url=simulator_url)
    fd = box_libvirt.open_netns_of(holder.pid)
    try:
        libvirtd = box_libvirt.start(box.dir, logs / f"box-{box.name}-libvirtd.log", fd)
    finally:
        os.close(fd)
    data["libvirtd"] = libvirtd.to_json()
    _write_processes(box, data)
    box_libvirt.wait_ready(box.dir)
    return True


def netns_pid(box: Box) -> int:
    """The PID of the holder of the box's network namespace (the box must be on)."""
    record = box.record("netns")
    if record is None or not record.alive():
        raise RuntimeError(f"box {box.name}: its network namespace is not up (the box is off)")
    return record.pid


def _destroy_domains(box: Box) -> None:
    import libvirt

    with contextlib.suppress(libvirt.libvirtError):
        conn = libvirt.open(box.uri)
        try:
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
        finally:
            conn.close()


def qemu_pids(box: Box) -> list[int]:
    """The QEMU processes of the box's domains, from their pidfiles in its namespace's /run."""
    pids = []
    for pidfile in (box.dir / "ns" / "run" / "libvirt" / "qemu").glob("*.pid"):
        with contextlib.suppress(ValueError, OSError, psutil.Error):
            pid = int(pidfile.read_text().strip())
            if any("qemu-system" in part for part in psutil.Process(pid).cmdline()[:1]):
                pids.append(pid)
    return pids


def power_cut(box: Box) -> None:
    """The box's OS gone at once: its domains destroyed (while its libvirtd answers), its
    libvirtd stopped, any QEMU left killed by PID, its network namespace's holder ended."""
    libvirtd = box.record("libvirtd")
    if libvirtd is not None and libvirtd.alive():
        _destroy_domains(box)
        stop(libvirtd, grace=3.0)
    for pid in qemu_pids(box):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(5)
    holder = box.record("netns")
    if holder is not None:
        stop(holder, grace=0.5)
    (box.dir / PROCESSES).unlink(missing_ok=True)


def wipe(box: Box) -> None:
    """An install formats the box's disk: its VMs, its libvirt state and keys are gone (the box
    must be off); the marker stays (the box is still racked with its own libvirtd)."""
    power_cut(box)
    for sub in ("images", "pki", "ns", "sock"):
        shutil.rmtree(box.dir / sub, ignore_errors=True)
    for name in ("libvirtd.conf", "ns-start.sh", "libvirtd.log", "libvirtd.pid"):
        (box.dir / name).unlink(missing_ok=True)


def power_cut_all(state_dir: Path | str, common_images: Path | str) -> int:
    """`lab down`: every box's processes stopped by PID; how many boxes were on."""
    on = 0
    for box in all_boxes(state_dir, common_images):
        if box.processes():
            on += 1
            power_cut(box)
    return on
