"""Issue 48: two live stores refreshed onto their new boxes, each box with a libvirtd of its own
(lab/box_libvirt.py) reached over libvirt's TLS transport with certificates the master's CA
signed. rf1 is a SLES 15 SP7 + Xen store (an offline move: shut down, its disks copied and
checked, defined and started on the new box), rf2 a SLE 16 + KVM store (a live migration with
its disks). For each: the file on its data disk reads the same after, the VM's minion id and
key are unchanged (no new key, nothing pending), the ERP has one store-hardware-refreshed
notice, the go-live gate passes on the new box, the old box is off and holds no domain, and the
run's result says the downtime. First, a refresh onto another store's box is refused before
anything moves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.hardware import box_info, rack
from lab.state import LabInfo
from store_rollout.contracts import ERP_STORE_HARDWARE_REFRESHED
from tasks.salt import SaltMasterClient
from tests.helpers import (
    cli_in_process,
    created_erp_notices,
    finish,
    go_live_table,
    power_actions,
    start_rollout,
    write_inventory,
)

pytestmark = [pytest.mark.lab, pytest.mark.extended]

XEN, KVM = "rf1", "rf2"  # write_inventory: the odd stores sles15-xen, the even sle16-kvm
MAC_PREFIX = "52:54:00:48:01"
NEW_MACS = {XEN: "52:54:00:48:02:a1", KVM: "52:54:00:48:02:b2"}
MARKER = ("srv/store", "till-journal.txt")
NEVER_ASK = {"STORE_ROLLOUT_APPROVAL_POLICY": "never"}


def vm(store_id: str) -> str:
    return f"store-{store_id}-vm"


def refresh_args(lab: LabInfo, store_id: str, inventory: Path) -> list[str]:
    """The new box racked (its own libvirtd, behind Redfish) and the CLI's options for it."""
    box = rack(lab, store_id, NEW_MACS[store_id], "redfish", name=f"store-{store_id}-hv-new",
               own_libvirt=True)
    fields = {"mac": NEW_MACS[store_id], **box.inventory_fields()}
    options = {"mac": "--mac", "power_type": "--power-type", "power_address": "--bmc-address",
               "redfish_system_id": "--redfish-system-id", "serial": "--serial"}
    return ["refresh", store_id, *[arg for field, value in fields.items()
                                   for arg in (options[field], str(value))],
            "--inventory", str(inventory), "--yes", "--json"]


def defined_domains(box_dir: Path) -> list[str]:
    """The persistent domains a box's libvirtd keeps (its config files: readable with the box
    off, as a disk pulled from it would show)."""
    return sorted(p.stem for p in (box_dir / "ns" / "etc-libvirt" / "qemu").glob("*.xml"))


def test_two_live_stores_move_to_their_new_boxes_with_their_data(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inv.yaml", [XEN, KVM], MAC_PREFIX, lab=lab,
                                own_libvirt=True)
    raw = yaml.safe_load(inventory.read_text())
    for entry in raw["stores"]:
        entry["vm"]["data_disk_gib"] = 1
    inventory.write_text(yaml.safe_dump(raw))
    for proc in [start_rollout(lab_env, sid, inventory) for sid in (XEN, KVM)]:
        finish(proc)
    master = SaltMasterClient(lab.salt_master_config)
    before: dict[str, Any] = {}
    for sid in (XEN, KVM):
        path = str(master.cmd(vm(sid), "provisioning.root_path", list(MARKER)))
        assert master.cmd(vm(sid), "file.write", [path, f"sale of {sid}: 4.20 EUR"])
        before[sid] = {"path": path, "keys": master.fingerprints(vm(sid)),
                       "text": master.cmd(vm(sid), "file.read", [path]),
                       "old_box": box_info(lab, f"store-{sid}-hv")}
        assert before[sid]["old_box"] is not None and before[sid]["old_box"].running

    # a refresh onto another store's box: refused before anything is touched
    other = cli_in_process(lab_env, "refresh", XEN, "--mac", f"{MAC_PREFIX}:02",
                           "--inventory", str(inventory), "--yes", settings=NEVER_ASK)
    assert other.exit_code != 0
    assert "store rf2" in " ".join(other.output.split()), other.output
    assert master.cmd(vm(XEN), "test.ping") is True

    for sid in (XEN, KVM):
        done = cli_in_process(lab_env, *refresh_args(lab, sid, inventory), settings=NEVER_ASK)
        assert done.exit_code == 0, (done.stdout + done.stderr)[-4000:]
        result = json.loads(done.stdout)
        assert result["outcome"] == "refreshed", result
        move = result["move"]
        assert move["mode"] == ("offline" if sid == XEN else "live"), move
        assert move["downtime_seconds"] > 0, move
        new_minion = f"store-{sid}-hv-{NEW_MACS[sid].replace(':', '')[-6:]}"
        assert result["new_minion"] == new_minion, result
        # the store server: same minion, same key, nothing pending; its data moved with it
        assert master.fingerprints(vm(sid)) == before[sid]["keys"]
        assert master.key_state(vm(sid)) == "accepted"
        text = master.cmd(vm(sid), "file.read", [before[sid]["path"]])
        assert text == before[sid]["text"] and f"sale of {sid}: 4.20 EUR" in text
        assert {row["result"] for row in go_live_table(lab, sid)} == {"pass"}
        # on the new box's libvirtd, not on the old one's; the old box off and empty
        new_box = box_info(lab, f"store-{sid}-hv-new")
        assert new_box is not None and vm(sid) in defined_domains(new_box.dir)
        old_box = before[sid]["old_box"]
        assert defined_domains(old_box.dir) == []
        assert not list((old_box.images_dir / vm(sid)).glob("*"))
        assert power_actions(lab, f"store-{sid}-hv")["off"] >= 1
        assert master.key_state(f"store-{sid}-hv") is None  # the old box's key deleted
        assert master.key_state(new_minion) == "accepted"
        notices = [n for n in created_erp_notices(lab, sid)
                   if n["payload"]["status"] == ERP_STORE_HARDWARE_REFRESHED]
        assert len(notices) == 1, notices
        print(f"store {sid}: {move['mode']} move, downtime {move['downtime_seconds']:.3f} s, "
              f"{move.get('bytes')} bytes")
