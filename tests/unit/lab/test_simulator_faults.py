"""The simulator's fault knobs per machine (`<step>@<machine>`), the `service_start` fault
lasting a whole boot (lab_service, as host_namespace.py's boot calls it), and the data disk's
content going in and out of data.raw (lab/simulator/data_disk.py) with e2fsprogs alone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from lab.simulator.data_disk import DataDiskMounts, extract, mount_point, write_back
from lab.simulator.faults import FaultKnobs
from lab.state import REPO_ROOT


def test_a_machines_knob_applies_to_it_alone_and_first() -> None:
    faults = FaultKnobs()
    faults.set("service_start@store-0003-vm", {"fail": 1})
    assert faults.take("service_start", "store-0004-vm") == (0.0, False)
    assert faults.armed("service_start", "store-0003-vm")
    assert not faults.armed("service_start", "store-0004-vm")
    assert faults.take("service_start", "store-0003-vm") == (0.0, True)
    assert not faults.armed("service_start", "store-0003-vm")  # used up
    assert faults.take("service_start", "store-0003-vm") == (0.0, False)  # counted down
    faults.set("vm_boot", {"fail": 1})
    faults.set("vm_boot@store-0003-vm", {"never": True})
    assert faults.take("vm_boot", "store-0003-vm", "store-0003-vm")[1]
    assert faults.take("vm_boot", "store-0004-vm")[1]  # the step's own knob, once
    assert not faults.take("vm_boot", "store-0004-vm")[1]
    assert faults.taken_snapshot() == {
        "service_start@store-0003-vm": {"delayed": 0, "failed": 1},
        "vm_boot@store-0003-vm": {"delayed": 0, "failed": 1},
        "vm_boot": {"delayed": 0, "failed": 1}}


@pytest.mark.parametrize(("name", "message"), [
    ("service_stop@store-0003-vm", "unknown step 'service_stop'"),
    ("service_start@", "the machine after '@'"),
    ("service_start@../x", "the machine after '@'"),
])
def test_a_knob_for_no_step_or_no_machine_is_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        FaultKnobs().set(name, {"fail": 1})


def _lab_service() -> ModuleType:
    path = REPO_ROOT / "lab" / "salt_overlay" / "_modules" / "lab_service.py"
    spec = importlib.util.spec_from_file_location("lab_service_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pos_unit(units: ModuleType, root: Path) -> None:
    unit_dir = root / units.UNIT_DIR
    unit_dir.mkdir(parents=True)
    (unit_dir / "pos.service").write_text("[Service]\nExecStart=/bin/sleep 30\n")
    (root / units.WANTS_DIR).mkdir(parents=True)
    (root / units.WANTS_DIR / "pos.service").symlink_to("../pos.service")


def test_the_steps_service_start_fault_leaves_a_technicians_start_working(
        tmp_path: Path) -> None:
    """The step's knob (issue 30's test): the units fail at boot, a later start works."""
    units = _lab_service()
    _pos_unit(units, tmp_path)
    try:
        assert units._boot(str(tmp_path), False) == {"pos.service": False}
        assert units._pid_of(str(tmp_path), "pos") is None
        assert units._start_unit(str(tmp_path), "pos") is True
    finally:
        units._stop_unit(str(tmp_path), "pos")


def test_a_machines_own_service_start_fault_lasts_the_whole_boot(tmp_path: Path) -> None:
    units = _lab_service()
    _pos_unit(units, tmp_path)
    try:
        assert units._boot(str(tmp_path), False, True) == {"pos.service": False}
        # a later start in the same boot (a highstate's service.running) fails too
        assert units._start_unit(str(tmp_path), "pos") is False
        assert units._pid_of(str(tmp_path), "pos") is None
        # the next boot without the fault starts it
        assert units._boot(str(tmp_path), True) == {"pos.service": True}
    finally:
        units._stop_unit(str(tmp_path), "pos")


def test_the_data_disks_content_goes_in_and_out_of_data_raw(tmp_path: Path) -> None:
    disk = tmp_path / "data.raw"
    with open(disk, "wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "STORE_DATA", str(disk)], check=True)
    uuid = subprocess.run(["blkid", "-p", "-s", "UUID", "-o", "value", str(disk)],
                          capture_output=True, text=True, check=True).stdout
    dirs = {"vm": tmp_path / "minions" / "vm"}
    dirs["vm"].mkdir(parents=True)
    mounts = DataDiskMounts(dirs.__getitem__)
    root = tmp_path / "root"
    staged = tmp_path / "staged"
    extract(disk, staged)
    assert sorted(p.name for p in staged.iterdir()) == ["lost+found"]
    mounts.mount("vm", root, disk, staged)
    assert mounts.mounted("vm") == disk
    (mount_point(root) / ".identity").mkdir(mode=0o700)
    (mount_point(root) / ".identity" / "minion_id").write_text("store-0003-vm\n")
    (mount_point(root) / "receipts.txt").write_text("receipt 1\n")
    assert mounts.unmount("vm", root) == disk and mounts.mounted("vm") is None
    assert mounts.unmount("vm", root) is None  # once
    again = tmp_path / "again"
    extract(disk, again)
    assert (again / "receipts.txt").read_text() == "receipt 1\n"
    assert (again / ".identity" / "minion_id").read_text() == "store-0003-vm\n"
    assert os.stat(again / ".identity").st_mode & 0o777 == 0o700
    # the same disk: size, label and UUID kept
    assert disk.stat().st_size == 32 * 1024 * 1024
    assert subprocess.run(["blkid", "-p", "-s", "UUID", "-o", "value", str(disk)],
                          capture_output=True, text=True, check=True).stdout == uuid
    write_back(again, disk)
    assert "STORE_DATA" in subprocess.run(["blkid", "-p", str(disk)], capture_output=True,
                                          text=True, check=True).stdout
