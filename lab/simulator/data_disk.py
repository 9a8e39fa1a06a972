"""A simulated store VM's data disk: the guest mounts its STORE_DATA disk (data.raw, ext4, made
by the hypervisor's storevirt.create_data_disk) at /srv/store; the simulator has no guest
kernel, so at domain start the file system's content becomes the VM minion's
<root>/srv/store, and at domain stop that directory is written back into data.raw, as the
guest's writes would have been. No mount: e2fsprogs' debugfs reads the disk and mkfs.ext4 -d
writes it (same label and UUID, same size)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from store_rollout.contracts import DATA_DISK_FILE, DATA_DISK_LABEL, DATA_DISK_MOUNT

log = logging.getLogger("lab.simulator")

MOUNTED_MARKER = "data-disk-mounted"  # in the minion's dir: the data.raw whose content it has


def data_disk_of(xml: ET.Element) -> Path | None:
    """The domain's data disk (a disk whose file is DATA_DISK_FILE), or None."""
    for source in xml.iterfind("./devices/disk[@device='disk']/source"):
        path = source.get("file", "")
        if Path(path).name == DATA_DISK_FILE:
            return Path(path)
    return None


def mount_point(root: Path) -> Path:
    return root / DATA_DISK_MOUNT.lstrip("/")


def extract(disk: Path, dest: Path) -> None:
    """The ext4 content of `disk` into the empty or absent directory `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["debugfs", "-R", f"rdump / {dest}", str(disk)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0 or "rdump:" in proc.stderr:
        raise RuntimeError(f"data disk {disk}: debugfs could not read it: {proc.stderr.strip()}")


def write_back(source: Path, disk: Path) -> None:
    """`source` as the content of ext4 disk `disk` (in place: same file, size, label, UUID)."""
    uuid = subprocess.run(["blkid", "-p", "-s", "UUID", "-o", "value", str(disk)],
                          capture_output=True, text=True, check=False).stdout.strip()
    argv = ["mkfs.ext4", "-q", "-F", "-L", DATA_DISK_LABEL, "-E", "nodiscard", "-d", str(source)]
    if uuid:
        argv += ["-U", uuid]
    subprocess.run([*argv, str(disk)], capture_output=True, text=True, check=True)


class DataDiskMounts:
    """Which simulated machine has which data disk's content (a marker in its minion dir)."""

    def __init__(self, minion_dir: Callable[[str], Path]) -> None:
        self.minion_dir = minion_dir

    def mounted(self, minion_id: str) -> Path | None:
        marker = self.minion_dir(minion_id) / MOUNTED_MARKER
        return Path(marker.read_text()) if marker.exists() else None

    def mount(self, minion_id: str, root: Path, disk: Path, staged: Path) -> None:
        """`staged` (the disk's content, extracted) becomes the machine's <root>/srv/store."""
        target = mount_point(root)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), str(target))
        (self.minion_dir(minion_id) / MOUNTED_MARKER).write_text(str(disk))
        log.info("%s: data disk %s mounted at %s", minion_id, disk, target)

    def moved(self, minion_id: str, disk: Path) -> None:
        """The machine's data disk is `disk` now (a live migration: the same disk, copied to
        the new box); its next stop writes back there."""
        (self.minion_dir(minion_id) / MOUNTED_MARKER).write_text(str(disk))
        log.info("%s: data disk now %s", minion_id, disk)

    def discard(self, minion_id: str) -> None:
        """A power cut: what the machine wrote since it booted never reaches the disk."""
        marker = self.minion_dir(minion_id) / MOUNTED_MARKER
        if marker.exists():
            log.info("%s: power cut, data disk %s not written back", minion_id,
                     marker.read_text())
        marker.unlink(missing_ok=True)

    def unmount(self, minion_id: str, root: Path) -> Path | None:
        """Write the machine's <root>/srv/store back into the data disk it came from; the disk,
        or None when none is mounted. The machine's minion must be stopped."""
        disk = self.mounted(minion_id)
        if disk is None:
            return None
        try:
            if not disk.exists():
                raise FileNotFoundError(disk)
            write_back(mount_point(root), disk)
            log.info("%s: data disk %s written back from %s", minion_id, disk, mount_point(root))
        except (OSError, subprocess.CalledProcessError) as exc:
            log.warning("%s: data disk %s could not be written back (removed with its VM?): "
                        "%s", minion_id, disk, getattr(exc, "stderr", None) or exc)
        (self.minion_dir(minion_id) / MOUNTED_MARKER).unlink(missing_ok=True)
        return disk

