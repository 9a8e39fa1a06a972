"""The store VM's data disk and an image update's system disk on the hypervisor (storevirt's
create_data_disk, stage_system_disk, shutdown, switch_system_disk, revert_system_disk,
commit_update, update_record, prune_system_disks, domain_summary, remove_vm), called through
Salt 3006.0's loader under the store host's Python 3.6 (tests/host36/run_host_calls.py) with
real qemu-img and mkfs.ext4 and libvirt's in-process test driver."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from store_rollout.contracts import DATA_DISK_FILE, DATA_DISK_LABEL, UPDATE_RECORD_FILE
from tests.unit.salt_states.test_host_python36 import VM, ok, run_on_host_python


def base_image(images: Path, key: str, version: str) -> Path:
    base = images / "base" / key / "image.qcow2"
    base.parent.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    (base.parent / "meta.json").write_text(json.dumps(
        {"key": key, "params": {"IMAGE_VERSION": version}}))
    return base


def domain_with_data_disk(system: Path, data: Path) -> str:
    return f"""<domain type='test'><name>{VM}</name><memory>65536</memory>
<os><type>hvm</type></os><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{system}'/>
<target dev='vda' bus='virtio'/></disk>
<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{data}'/>
<target dev='vdb' bus='virtio'/></disk>
<interface type='network'><mac address='52:54:00:00:00:36'/><source network='default'/>
</interface></devices></domain>"""


def debugfs(disk: Path, request: str) -> str:
    return subprocess.run(["debugfs", "-R", request, str(disk)], capture_output=True, text=True,
                          check=True).stdout


def test_data_disk_and_system_disk_switch_under_the_store_hosts_python(tmp_path: Path) -> None:
    images = tmp_path / "images"
    key1, key2 = "a1" * 20, "b2" * 20
    base1, base2 = base_image(images, key1, "v1"), base_image(images, key2, "v2")
    system = images / VM / "system.qcow2"
    staged = images / VM / f"system-{key2[:12]}.qcow2"
    data = images / VM / DATA_DISK_FILE
    calls = [
        {"fun": "storevirt.create_overlay", "args": [VM, str(base1), 32]},
        {"fun": "storevirt.create_data_disk", "args": [VM, 1]},
        {"fun": "storevirt.domain_summary", "args": [VM]},
        {"fun": "storevirt.stage_system_disk", "args": [VM, str(base2)]},
        {"fun": "storevirt.stage_system_disk", "args": [VM, str(base1)]},
        {"fun": "storevirt.switch_system_disk", "args": [VM, str(staged), "v2", "run-1"]},
        {"fun": "storevirt.shutdown", "args": [VM, 10]},
        {"fun": "storevirt.shutdown", "args": [VM, 10]},
        {"fun": "storevirt.switch_system_disk", "args": [VM, str(staged), "v2", "run-1"]},
        {"fun": "storevirt.update_record", "args": [VM]},
        {"fun": "storevirt.switch_system_disk", "args": [VM, str(staged), "v2", "run-1"]},
        {"fun": "storevirt.prune_system_disks", "args": [VM]},
        {"fun": "storevirt.revert_system_disk", "args": [VM]},
        {"fun": "storevirt.update_record", "args": [VM]},
        {"fun": "storevirt.prune_system_disks", "args": [VM]},
        {"fun": "storevirt.stage_system_disk", "args": [VM, str(base2)]},
        {"fun": "storevirt.switch_system_disk", "args": [VM, str(staged), "v2", "run-2"]},
        {"fun": "storevirt.commit_update", "args": [VM, 0]},
        {"fun": "storevirt.prune_system_disks", "args": [VM]},
        {"fun": "storevirt.create_data_disk", "args": [VM, 2]},
        {"fun": "storevirt.commit_update", "args": ["store-0037-vm", 1]},
        {"fun": "storevirt.remove_vm", "args": [VM]},
        {"fun": "storevirt.create_data_disk", "args": ["store-0038-vm", 0]},
    ]
    before = time.time()
    (overlay, made, summary, stage, refused_stage, refused_running, shut, shut_again, switched,
     record, again, nothing_pruned, reverted, reverted_record, pruned_attempt, restaged,
     switched2, committed, pruned_old, kept, no_record, removed, bad_size) = run_on_host_python(
        tmp_path, calls, define=(domain_with_data_disk(system, data),), start=[VM])
    assert ok(overlay)["created"]
    assert ok(made) == {"path": str(data), "created": True}
    assert data.stat().st_size == 1024 ** 3 and data.stat().st_blocks * 512 < 64 * 1024 ** 2
    label = subprocess.run(["blkid", "-p", "-s", "LABEL", "-o", "value", str(data)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert label == DATA_DISK_LABEL
    assert ok(summary)["data_disk"] == str(data) and ok(summary)["disk"] == str(system)
    assert ok(summary)["image_key"] == key1
    assert ok(stage) == {"path": str(staged), "created": True}
    assert not refused_stage["ok"] and "current system disk" in refused_stage["error"]
    assert "is never touched" in refused_stage["error"]
    assert not refused_running["ok"] and "running" in refused_running["error"], refused_running
    assert ok(shut)["was_running"] and ok(shut)["clean"]
    assert ok(shut_again) == {"was_running": False, "clean": True, "seconds": 0.0}
    assert ok(switched)["disk"] == str(staged) and ok(switched)["image_key"] == key2
    assert ok(switched)["data_disk"] == str(data) and ok(switched)["uuid"] == ok(summary)["uuid"]
    rec = ok(record)
    assert {k: rec[k] for k in ("from", "to", "from_version", "to_version", "run", "phase")} == {
        "from": str(system), "to": str(staged), "from_version": "v1", "to_version": "v2",
        "run": "run-1", "phase": "switched"}
    assert before <= rec["switched_at"] <= time.time()
    assert ok(again)["disk"] == str(staged)  # idempotent
    assert ok(nothing_pruned) == []  # an update in progress keeps both disks
    assert ok(reverted)["disk"] == str(system) and ok(reverted)["image_key"] == key1
    assert ok(reverted_record)["phase"] == "reverted" and ok(reverted_record)["reverted_at"]
    assert ok(pruned_attempt) == [str(staged)]
    assert ok(restaged)["created"] and ok(switched2)["disk"] == str(staged)
    assert ok(committed)["phase"] == "committed"
    assert ok(committed)["keep_until"] <= time.time() and ok(committed)["from_version"] == "v1"
    assert ok(pruned_old) == [str(system)]  # the kept disk once its keep time passed
    # an existing data disk is never reformatted or resized
    assert ok(kept) == {"path": str(data), "created": False}
    assert data.stat().st_size == 1024 ** 3
    assert not no_record["ok"] and "no update record" in no_record["error"]
    assert ok(removed) == {"domain": True, "disk_dir": True, "data_kept": str(data)}
    assert sorted(p.name for p in data.parent.iterdir()) == [DATA_DISK_FILE, UPDATE_RECORD_FILE]
    assert "lost+found" in debugfs(data, "ls -l /")
    assert not bad_size["ok"] and "vm.data_disk_gib" in bad_size["error"]
    assert not (images / "store-0038-vm" / DATA_DISK_FILE).exists()


def test_remove_vm_deletes_the_data_disk_only_when_asked(tmp_path: Path) -> None:
    data = tmp_path / "images" / VM / DATA_DISK_FILE
    made, removed = run_on_host_python(tmp_path, [
        {"fun": "storevirt.create_data_disk", "args": [VM, 1]},
        {"fun": "storevirt.remove_vm", "args": [VM], "kwargs": {"keep_data": False}},
    ])
    assert ok(made)["created"]
    assert ok(removed) == {"domain": False, "disk_dir": True, "data_kept": None}
    assert not data.parent.exists()
