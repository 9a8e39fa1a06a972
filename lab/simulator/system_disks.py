"""A simulated VM's system disks: a real qcow2 overlay keeps its own content, so the machine's
"/" (its minion's root_dir and config dir, minus the data disk's /srv/store, which is
data.raw's) belongs to the system disk it booted. When a domain boots another system disk (an
image update's switch), the root of the disk it leaves is kept here by that disk's identity,
and given back when that disk boots again (a revert): its synced modules, its units, its
grains. A disk never seen before, or one made anew at the same path since (storevirt's
stage_system_disk recreates a reverted attempt's overlay), gets a fresh install."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from lab.simulator.data_disk import mount_point

log = logging.getLogger("lab.simulator")

CONFIG_DIR = "etc"  # in the minion's dir: its config (minion.d, grains), the system disk's
FILE_RECORD = "disk.json"


def file_of(identity: str) -> Path:
    """The disk file in a disk identity ("<domain uuid> <path>": vm_boot._disk_identity)."""
    return Path(identity.split(" ", 1)[-1])


def file_stamp(path: Path) -> list[int]:
    """What tells one file at a path from a file made anew there: inode and mtime."""
    stat = path.stat()
    return [stat.st_ino, stat.st_mtime_ns]


class SystemDisks:
    """The roots of the system disks a machine is not running, under `base`/<minion id>/."""

    def __init__(self, base: Path,
                 resolve: Callable[[str, Path], Path] = lambda _minion, path: path) -> None:
        """`resolve`: a disk file as the simulator reaches it, for the machine (a box with its
        own libvirtd names the common images path; its files are in the box's dir)."""
        self.base = base
        self.resolve = resolve

    def _slot(self, minion_id: str, identity: str) -> Path:
        return self.base / minion_id / hashlib.sha256(identity.encode()).hexdigest()[:16]

    def leave(self, minion_id: str, identity: str, mdir: Path, root: Path,
              has_data_disk: bool) -> None:
        """Keep the root of the disk `identity` the machine leaves (its minion stopped, its data
        disk written back): `root` without /srv/store when that is a data disk's, and the
        config dir. Stashes of disks whose file is gone are dropped."""
        self.prune(minion_id)
        disk = self.resolve(minion_id, file_of(identity))
        if not disk.exists() or not root.is_dir():
            return
        slot = self._slot(minion_id, identity)
        shutil.rmtree(slot, ignore_errors=True)
        slot.mkdir(parents=True)
        if has_data_disk:
            shutil.rmtree(mount_point(root), ignore_errors=True)
        shutil.move(str(root), str(slot / "root"))
        if (mdir / CONFIG_DIR).is_dir():
            shutil.move(str(mdir / CONFIG_DIR), str(slot / CONFIG_DIR))
        (slot / FILE_RECORD).write_text(json.dumps({"identity": identity,
                                                    "stamp": file_stamp(disk)}))
        log.info("%s: root of system disk %s kept (%s)", minion_id, disk, slot)

    def back(self, minion_id: str, identity: str, mdir: Path, root: Path) -> bool:
        """The kept root of disk `identity` made the machine's again; False (nothing kept, or
        the file was made anew since: a fresh disk) when there is none."""
        slot = self._slot(minion_id, identity)
        record = slot / FILE_RECORD
        if not (record.exists() and (slot / "root").is_dir() and (slot / CONFIG_DIR).is_dir()):
            return False
        kept = json.loads(record.read_text())
        disk = self.resolve(minion_id, file_of(identity))
        if kept.get("identity") != identity or not disk.exists() \
                or kept.get("stamp") != file_stamp(disk):
            log.info("%s: system disk %s was made anew since its root was kept: a fresh disk",
                     minion_id, disk)
            shutil.rmtree(slot, ignore_errors=True)
            return False
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(mdir / CONFIG_DIR, ignore_errors=True)
        mdir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(slot / "root"), str(root))
        shutil.move(str(slot / CONFIG_DIR), str(mdir / CONFIG_DIR))
        shutil.rmtree(slot)
        log.info("%s: system disk %s boots again with its own root", minion_id, disk)
        return True

    def prune(self, minion_id: str) -> None:
        """Drop what is kept of disks whose file was deleted (a pruned overlay, a removed VM)."""
        for record in sorted((self.base / minion_id).glob(f"*/{FILE_RECORD}")):
            try:
                gone = not self.resolve(minion_id, file_of(
                    json.loads(record.read_text())["identity"])).exists()
            except (OSError, ValueError, KeyError):
                gone = True
            if gone:
                shutil.rmtree(record.parent, ignore_errors=True)
