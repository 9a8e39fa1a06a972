"""Issue 47: the store VM's data disk in the lab. What the store server writes to /srv/store
is on the hypervisor's data.raw once the VM is shut down (read there with debugfs, not through
the VM), and a new system disk (storevirt's stage, switch, start: an image update's hypervisor
side) boots as the same minion with the same accepted key, the data still there, no firstboot.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import salt.config

from lab.state import LabInfo, LabPaths
from store_rollout.contracts import BOOTSTRAP_CONF, DATA_DISK_FILE, FIRSTBOOT_STAGE_GRAIN
from tasks.salt import SaltMasterClient
from tests.helpers import finish, start_rollout, wait_for, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.extended]

RECEIPT = "receipt 0001: 3 x bread, paid"  # file.write ends it with a newline


def debugfs_cat(disk: str, path: str) -> str:
    proc = subprocess.run(["debugfs", "-R", f"cat {path}", disk], capture_output=True,
                          text=True, check=True)
    return proc.stdout


def accepted_key(lab: LabInfo, minion_id: str) -> str:
    pki = Path(salt.config.master_config(lab.salt_master_config)["pki_dir"])
    return (pki / "minions" / minion_id).read_text()


def test_the_data_disk_keeps_the_stores_data_and_identity_across_a_new_system_disk(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", ["dd1"], "52:54:00:d4:00", lab=lab)
    result = finish(start_rollout(lab_env, "dd1", inventory))
    assert result["state"] == "Completed", result
    hv, vm = "store-dd1-hv", "store-dd1-vm"
    master = SaltMasterClient(lab.salt_master_config)
    summary = master.cmd(hv, "storevirt.domain_summary", [vm])
    data = summary["data_disk"]
    assert data and Path(data).name == DATA_DISK_FILE and summary["active"], summary
    assert summary["image_key"] == result["image_key"], summary
    key = accepted_key(lab, vm)

    # the store server writes its data where the data disk is mounted
    store_dir = master.cmd(vm, "provisioning.root_path", ["srv", "store"])
    master.cmd(vm, "file.write", [f"{store_dir}/receipts.txt", RECEIPT])

    # a clean shutdown (the ACPI button): the guest's writes are on the data disk
    shut = master.cmd(hv, "storevirt.shutdown", [vm, 60], timeout=90)
    assert shut["was_running"] and shut["clean"], shut
    assert debugfs_cat(data, "/receipts.txt") == RECEIPT + "\n"
    assert debugfs_cat(data, "/.identity/minion_id").strip() == vm

    # a new system disk on the same base, switched to and started
    staged = master.cmd(hv, "storevirt.stage_system_disk", [vm, summary["backing"]])
    assert staged["created"] and staged["path"] != summary["disk"], staged
    switched = master.cmd(hv, "storevirt.switch_system_disk", [vm, staged["path"]],
                          kwarg={"run": "test-data-disk"})
    assert switched["disk"] == staged["path"] and switched["uuid"] == summary["uuid"], switched
    assert switched["data_disk"] == data
    assert master.cmd(hv, "storevirt.update_record", [vm])["from"] == summary["disk"]
    master.cmd(hv, "virt.start", [vm])
    wait_for(lambda: master.ping(vm, timeout=3), timeout=90,
             what=f"{vm}'s minion back on its new system disk")

    # the same minion with the same key: nothing new waits on the master
    keys = master.list_keys()
    assert vm in keys["minions"] and vm not in keys.get("minions_pre", []), keys
    assert accepted_key(lab, vm) == key
    assert master.cmd(vm, "file.read", [f"{store_dir}/receipts.txt"]) == RECEIPT + "\n"
    # a fresh system disk (the simulator's for the new overlay) without the bootstrap file:
    # no firstboot ran on it (its stage grain, on the system disk, was never set again)
    minion_dir = LabPaths(Path(lab.state_dir)).simulator / "minions" / vm
    assert staged["path"] in (minion_dir / "disk").read_text()
    assert not (minion_dir / "etc" / "minion.d" / BOOTSTRAP_CONF).exists()
    assert master.cmd(vm, "grains.get", [FIRSTBOOT_STAGE_GRAIN]) == ""
