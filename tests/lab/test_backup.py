"""Issue 48, backups: a live store's data disk backed up to the region's backup target (the
lab's `rclone serve restic`, lab/backup_server.py) through its VM's minion, verified by the
admin side; its box then dies (BMC power off, never back) and `replace` brings the store back
on a new box with its data disk's content from that backup: the file the store wrote is there,
the run's result names the snapshot and its age, `plan` said so before, and reconcile shows the
store's last backup.

The lab's boxes share one libvirtd, so the dead box is also unracked (its VM's domain and
disks removed), as tests/lab/test_rollout_e2e.py's destroyed box is. Its store and MACs are
its own (tests/structure/test_lab_tests_isolated.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from lab.backup_server import ADMIN_USER, BackupFiles
from lab.state import LabInfo
from tasks.backup import ResticAdmin
from tasks.salt import SaltMasterClient
from tests.helpers import bmc_power, cli_in_process, finish, start_rollout, wait_for, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.extended]

STORE = "b48"
VM = f"store-{STORE}-vm"
HV = f"store-{STORE}-hv"
NEW_MAC = "52:54:00:48:b2:01"
JOURNAL = "till-journal.txt"


def admin(lab: LabInfo) -> ResticAdmin:
    """The backup server's admin side as the orchestrator's Block describes it."""
    key, password = BackupFiles.of(Path(lab.state_dir)).ensure_secrets()
    return ResticAdmin(lab.backup_admin_url, ADMIN_USER, SecretStr(password), SecretStr(key),
                       lab.backup_ca_file)


def on_data_disk(master: SaltMasterClient, name: str) -> str:
    """The path of `name` on the VM's data disk (under a simulated VM's own root)."""
    return str(master.cmd(VM, "provisioning.root_path", ["srv/store", name]))


def reconcile(lab_env: dict[str, str], inventory: Path,
              max_age_hours: str = "") -> dict[str, Any]:
    """The store's reconcile status (the command exits 1 when it finds a mismatch)."""
    done = cli_in_process(lab_env, "reconcile", STORE, "--inventory", str(inventory), "--json",
                          settings={"STORE_ROLLOUT_BACKUP_MAX_AGE_HOURS": max_age_hours}
                          if max_age_hours else None)
    status = dict(json.loads(done.stdout)["stores"][STORE])
    assert done.exit_code == (1 if status["mismatches"] else 0), (
        done.exception, done.stdout[-3000:] + done.stderr[-3000:])
    return status


def test_a_dead_boxs_store_comes_back_from_its_last_backup(lab: LabInfo, lab_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inv.yaml", [STORE], "52:54:00:48:b1", lab=lab)
    finish(start_rollout(lab_env, STORE, inventory))
    master = SaltMasterClient(lab.salt_master_config)
    written = "sale 1001: 3 x bread\n"
    assert master.cmd(VM, "file.write", [on_data_disk(master, JOURNAL), written])
    on_disk = master.cmd(VM, "file.read", [on_data_disk(master, JOURNAL)])
    assert on_disk.startswith(written)  # (file.write ends it with a newline of its own)
    # a store live for less than backup_max_age_hours is not missing its first backup yet
    assert reconcile(lab_env, inventory)["mismatches"] == []
    before = reconcile(lab_env, inventory, max_age_hours="0.0001")
    assert [m["code"] for m in before["mismatches"]] == ["backup-missing"], before
    assert before["last_backup"] == "none"

    done = cli_in_process(lab_env, "backup", STORE, "--inventory", str(inventory), "--json")
    assert done.exit_code == 0, (done.exception, done.stdout[-3000:] + done.stderr[-3000:])
    backup = json.loads(done.stdout)
    assert backup["verified"] is True and backup["files"] >= 1, backup
    listed = admin(lab).snapshots(VM)
    assert [s["id"] for s in listed] == [backup["snapshot"]]
    assert listed[0]["hostname"] == VM
    after = reconcile(lab_env, inventory)
    assert (after["status"], after["mismatches"]) == ("ok", []), after
    assert after["last_backup"].startswith(backup["short_id"]), after
    stale = reconcile(lab_env, inventory, max_age_hours="0.0001")
    assert [m["code"] for m in stale["mismatches"]] == ["backup-stale"], stale

    # the box dies: off through its BMC, and never back; then out of the rack (the lab's one
    # libvirtd holds every box's domains: the dead box's VM and its data disk go with it, as
    # they would with its disk, so nothing of the old data disk can reach the new box)
    bmc_power(lab, HV, "off")
    wait_for(lambda: not master.ping(VM, timeout=2), timeout=60, what=f"{VM} down with its box")
    from lab.hardware import rack, unrack

    unrack(lab, STORE)
    assert not (Path(lab.vm_images_dir) / VM / "data.raw").exists()

    box = rack(lab, STORE, NEW_MAC, "redfish", name=f"{HV}-new")
    fields = {"mac": NEW_MAC, **box.inventory_fields()}
    plan = cli_in_process(lab_env, "plan", STORE, "--replace-mac", NEW_MAC, "--inventory",
                          str(inventory), "--json")
    assert plan.exit_code == 0, (plan.exception, plan.stdout[-3000:] + plan.stderr[-3000:])
    firstboot = next(s for s in json.loads(plan.stdout)[STORE]["steps"]
                     if s["step"] == "firstboot")
    assert any(d.startswith(f"restore backup {backup['short_id']}") for d in
               firstboot["details"]), firstboot

    options = {"mac": "--mac", "power_type": "--power-type", "power_address": "--bmc-address",
               "redfish_system_id": "--redfish-system-id", "serial": "--serial"}
    args = [arg for field, value in fields.items() for arg in (options[field], str(value))]
    replaced = cli_in_process(lab_env, "replace", STORE, *args, "--inventory", str(inventory),
                              "--yes", "--json",
                              settings={"STORE_ROLLOUT_APPROVAL_POLICY": "never"})
    assert replaced.exit_code == 0, (replaced.exception, replaced.stderr[-3000:])
    result = json.loads(replaced.stdout)
    assert result["state"] == "Completed", result
    assert result["vm"]["reused"] is False  # a new VM, on a new data disk
    restored = result["restored_backup"]
    assert (restored["snapshot"], restored["already"]) == (backup["snapshot"], False), restored
    assert 0 <= restored["age_hours"] < 1
    assert master.cmd(VM, "file.read", [on_data_disk(master, JOURNAL)]) == on_disk

    raw = yaml.safe_load(inventory.read_text())
    raw["stores"][0]["hypervisor"].update(fields)
    moved = inventory.with_name("moved.yaml")
    moved.write_text(yaml.safe_dump(raw))
    status = reconcile(lab_env, moved)
    assert status["last_backup"].startswith(backup["short_id"]), status
    assert "backup-missing" not in [m["code"] for m in status["mismatches"]], status
