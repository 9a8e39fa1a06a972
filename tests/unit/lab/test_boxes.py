"""Boxes with a libvirtd of their own (lab/boxes.py, issue 48), the pure parts: the paths a box's
libvirtd names and where the lab finds them, the host namespace's binds, what each lifecycle
event sets off, and a migration's re-homing of a VM's minion and data disk."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

import libvirt
import psutil
import pytest

from lab import box_libvirt
from lab.boxes import Box, mark, own_box
from lab.host_namespace import bind_plan
from lab.simulator.data_disk import MOUNTED_MARKER
from lab.simulator.faults import FaultKnobs
from lab.simulator.firmware import box_minion_config, box_minion_d
from lab.simulator.minions import BOX_FILE, MinionManager
from lab.simulator.vm_boot import VmBoot, event_action, stop_counts
from lab.state import LabInfo, LabPaths


def test_a_box_maps_the_common_images_path_to_its_own_dir_and_back(tmp_path: Path) -> None:
    box = Box("store-x-hv", tmp_path / "boxes" / "store-x-hv", tmp_path / "libvirt" / "images")
    common = tmp_path / "libvirt" / "images" / "store-x-vm" / "data.raw"
    local = box.local(common)
    assert local == box.images / "store-x-vm" / "data.raw"
    assert box.common(local) == common
    assert box.local("/etc/hosts") == Path("/etc/hosts")  # not an image: as it is
    assert box.uri == box_libvirt.uri(box.dir)


def test_racking_marks_the_box_and_only_it() -> None:
    with tempfile.TemporaryDirectory(prefix="bx", dir="/tmp") as short:  # socket path limit
        _check_marks(Path(short))


def _check_marks(tmp_path: Path) -> None:
    assert own_box(tmp_path, "store-x-hv", tmp_path / "images") is None
    mark(tmp_path, "store-x-hv", "x")
    box = own_box(tmp_path, "store-x-hv", tmp_path / "images")
    assert box is not None and box.store_id == "x" and not box.running()
    assert own_box(tmp_path, "store-y-hv", tmp_path / "images") is None
    with pytest.raises(ValueError, match="too deep"):
        mark(tmp_path / ("d" * 120), "store-x-hv", "x")


def test_the_host_namespace_binds_kept_paths_then_the_boxs_images_over_the_common_path() -> None:
    plan = bind_plan(["/lab/m", "/lab/boxes/b/sock"], [["/lab/boxes/b/images", "/lab/images"]])
    assert plan == [("/lab/m", "/lab/m"), ("/lab/boxes/b/sock", "/lab/boxes/b/sock"),
                    ("/lab/boxes/b/images", "/lab/images")]
    with pytest.raises(SystemExit, match="bound twice: /lab/images"):
        bind_plan(["/lab/images"], [["/lab/boxes/b/images", "/lab/images/"]])


@pytest.mark.parametrize(("event", "detail", "action"), [
    (libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_BOOTED, "boot"),
    # an incoming migration's domain starts paused: the guest is not booting
    (libvirt.VIR_DOMAIN_EVENT_STARTED, libvirt.VIR_DOMAIN_EVENT_STARTED_MIGRATED, ""),
    (libvirt.VIR_DOMAIN_EVENT_RESUMED, libvirt.VIR_DOMAIN_EVENT_RESUMED_MIGRATED, "migrated-in"),
    (libvirt.VIR_DOMAIN_EVENT_RESUMED, libvirt.VIR_DOMAIN_EVENT_RESUMED_UNPAUSED, ""),
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_MIGRATED, "migrated-out"),
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_DESTROYED, "stop"),
    (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_FAILED, "stop"),
    (libvirt.VIR_DOMAIN_EVENT_SHUTDOWN, libvirt.VIR_DOMAIN_EVENT_SHUTDOWN_FINISHED, "stop"),
    (libvirt.VIR_DOMAIN_EVENT_DEFINED, 0, "defined"),
    (libvirt.VIR_DOMAIN_EVENT_SUSPENDED, libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED, ""),
])
def test_what_each_lifecycle_event_sets_off(event: int, detail: int, action: str) -> None:
    assert event_action(event, detail) == action


def test_only_the_domains_home_libvirtd_stops_it() -> None:
    assert stop_counts(None, None)  # the shared libvirtd's own domain
    assert stop_counts("a", "a")
    # the source's copy after a move, or a failed incoming migration's on the destination
    assert not stop_counts("b", "a")
    assert not stop_counts("a", None)


def test_a_boxs_minion_config_names_its_own_libvirtd_and_pki(tmp_path: Path) -> None:
    box = Box("store-x-hv", tmp_path / "boxes" / "store-x-hv", tmp_path / "images")
    shared = "qemu+unix:///system?socket=/lab/libvirt/sock/libvirt-sock"
    files = {"50-store-rollout.conf": f"virt:\n  connection:\n    uri: '{shared}'\n",
             "60-libvirt-events.conf": f"engines:\n  - store_libvirt_events:\n      uri: '{shared}'\n"}
    rewritten = box_minion_d(files, shared, box.uri)
    assert all(shared not in text and box.uri in text for text in rewritten.values())
    config = box_minion_config(box)
    assert config["virt"] == {"connection": {"uri": box.uri}}
    assert config["storevirt"] == {"pki_dir": str(box.pki),
                                   "tls_reload": box_libvirt.reload_tls_argv(box.dir)}


def _vm_boot(tmp_path: Path) -> VmBoot:
    paths = LabPaths(tmp_path)
    paths.logs.mkdir(parents=True)
    (paths.simulator / "minions").mkdir(parents=True)
    info = LabInfo.model_construct(state_dir=str(tmp_path), libvirt_uri="test:///default",
                                   vm_images_dir=str(tmp_path / "libvirt" / "images"))
    minions = MinionManager(paths, info)
    return VmBoot(paths, info, FaultKnobs(), minions, threading.Event())


def test_a_live_migration_rehomes_the_vms_data_disk_and_the_old_box_stops_nothing(
        tmp_path: Path) -> None:
    vms = _vm_boot(tmp_path)
    common = tmp_path / "libvirt" / "images"
    old = Box("old", tmp_path / "boxes" / "old", common)
    new = Box("new", tmp_path / "boxes" / "new", common)
    vms.boxes = {"old": old, "new": new}
    vms.domain_minions["store-x-vm"] = "store-x-vm"
    vms.home["store-x-vm"] = "old"
    marker = vms.minions.minion_dir("store-x-vm") / MOUNTED_MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text(str(old.images / "store-x-vm" / "data.raw"))

    vms._rehome("store-x-vm", new)
    assert vms.home["store-x-vm"] == "new"
    # the next stop writes /srv/store back into the new box's data.raw
    assert marker.read_text() == str(new.images / "store-x-vm" / "data.raw")
    # the source's stop (its copy, undefined after the move) is not the VM's
    vms._on_domain_stopped("store-x-vm", old)
    assert marker.exists() and vms.home["store-x-vm"] == "new"
    assert vms._local_of_minion("store-x-vm", common / "store-x-vm" / "system.qcow2") == \
        new.images / "store-x-vm" / "system.qcow2"

    # the new box's power cut: the VM's minion stops without writing its data back
    vms.box_off(new)
    assert not marker.exists() and "store-x-vm" not in vms.home and "new" not in vms.boxes


def test_a_box_minion_joins_the_boxs_network_namespace_and_sees_its_images_at_the_common_path(
) -> None:
    with tempfile.TemporaryDirectory(prefix="bx", dir="/tmp") as short:  # socket path limit
        _check_box_minion_namespace(Path(short))


def _check_box_minion_namespace(tmp_path: Path) -> None:
    vms = _vm_boot(tmp_path)
    minions = vms.minions
    box = mark(tmp_path, "store-x-hv", "x")
    me = psutil.Process(os.getpid())
    (box.dir / "processes.json").write_text(json.dumps(
        {"netns": {"pid": me.pid, "create_time": me.create_time()}}))
    mdir = minions.minion_dir("store-x-hv")
    mdir.mkdir(parents=True)
    (mdir / "store-host").write_text("")
    (mdir / BOX_FILE).write_text(str(box.dir))
    argv = minions._apart("store-x-hv", mdir, Path("/venv/bin"), ["salt-minion"])
    assert argv[:4] == ["nsenter", f"--net=/proc/{me.pid}/ns/net", "--", "unshare"]
    assert "--network-pid" not in argv  # no network of its own: the box's
    assert argv[argv.index("--bind") + 1:argv.index("--bind") + 3] == [
        str(box.images), str(tmp_path / "libvirt" / "images")]
    kept = [a.removeprefix("--keep=") for a in argv if a.startswith("--keep=")]
    assert str(box.sock_dir) in kept and str(box.pki) in kept
    assert str(tmp_path / "libvirt" / "images") not in kept  # not the shared images
