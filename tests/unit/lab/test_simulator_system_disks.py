"""A simulated VM's system disks keep their own root (lab/simulator/system_disks.py): the root
of the disk a machine leaves comes back when that disk boots again (an image update's revert),
without the data disk's /srv/store; a disk made anew at the same path is a fresh disk. And a
machine's own `service_start` knob is taken at its next boot whatever it has (own_only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lab.simulator.faults import FaultKnobs
from lab.simulator.system_disks import SystemDisks

UUID = "0b5e4c1e-0000-4000-8000-000000000047"


def _disk(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "1M"], check=True)
    return f"{UUID} {path}"


def _machine(tmp_path: Path, synced: str) -> tuple[Path, Path]:
    mdir, root = tmp_path / "minions" / "vm", tmp_path / "roots" / "0"
    (mdir / "etc" / "minion.d").mkdir(parents=True)
    (mdir / "etc" / "minion.d" / "10-grains.conf").write_text(f"version: {synced}\n")
    (root / "var" / "cache" / "extmods").mkdir(parents=True)
    (root / "var" / "cache" / "extmods" / "storegate.py").write_text(synced)
    (root / "srv" / "store").mkdir(parents=True)
    (root / "srv" / "store" / "journal.txt").write_text("the data disk's")
    return mdir, root


def test_a_system_disk_booting_again_has_its_own_root_back(tmp_path: Path) -> None:
    disks = SystemDisks(tmp_path / "system-disks")
    v1, v2 = _disk(tmp_path / "images" / "system.qcow2"), _disk(tmp_path / "images" / "v2.qcow2")
    mdir, root = _machine(tmp_path, "v1")
    disks.leave("vm", v1, mdir, root, has_data_disk=True)  # the switch to v2
    assert not root.exists() and not (mdir / "etc").exists()
    assert not disks.back("vm", v2, mdir, root)  # never booted here: a fresh install's
    _machine(tmp_path, "v2")
    disks.leave("vm", v2, mdir, root, has_data_disk=True)  # the revert
    assert disks.back("vm", v1, mdir, root)
    assert (root / "var" / "cache" / "extmods" / "storegate.py").read_text() == "v1"
    assert (mdir / "etc" / "minion.d" / "10-grains.conf").read_text() == "version: v1\n"
    assert not (root / "srv" / "store").exists()  # the data disk's, not the system disk's
    assert not disks.back("vm", v1, mdir, root)  # given back once


def test_a_system_disk_made_anew_at_the_same_path_is_a_fresh_disk(tmp_path: Path) -> None:
    disks = SystemDisks(tmp_path / "system-disks")
    v2 = _disk(tmp_path / "images" / "v2.qcow2")
    mdir, root = _machine(tmp_path, "v2")
    disks.leave("vm", v2, mdir, root, has_data_disk=True)  # a reverted attempt
    path = tmp_path / "images" / "v2.qcow2"
    stamp = path.stat().st_mtime_ns
    os.remove(path)  # storevirt's stage_system_disk makes it anew for the next attempt
    _disk(path)
    os.utime(path, ns=(stamp + 1_000_000, stamp + 1_000_000))  # even within one clock tick
    assert not disks.back("vm", v2, mdir, root)
    assert not (tmp_path / "system-disks" / "vm").exists() or not any(
        (tmp_path / "system-disks" / "vm").iterdir())


def test_what_is_kept_of_a_deleted_disk_is_dropped(tmp_path: Path) -> None:
    disks = SystemDisks(tmp_path / "system-disks")
    old = _disk(tmp_path / "images" / "old.qcow2")
    mdir, root = _machine(tmp_path, "v1")
    disks.leave("vm", old, mdir, root, has_data_disk=False)
    (tmp_path / "images" / "old.qcow2").unlink()  # pruned after its keep time
    disks.prune("vm")
    assert list((tmp_path / "system-disks" / "vm").iterdir()) == []


def test_a_machines_own_knob_is_taken_at_its_next_boot_whatever_it_has() -> None:
    faults = FaultKnobs()
    faults.set("service_start", {"fail": 1})
    assert faults.take("service_start", "store-0003-vm", own_only=True) == (0.0, False)
    faults.set("service_start@store-0003-vm", {"fail": 1})
    assert faults.take("service_start", "store-0003-vm", own_only=True) == (0.0, True)
    assert faults.take("service_start", "store-0003-vm", own_only=True) == (0.0, False)
