"""Issue 47: one live store's image update in the lab, v1 to v2 (the lab's settings list both,
the chain runs v1). (1) It passes: the VM itself says v2, same minion id and key, its data disk's
file reads the same, the ERP has exactly one store-image-updated notice, the downtime is in the
result; a second run finds it there and touches nothing. (2) The go-live gate fails on the new
version (its store service dies as the gate starts): the store is back on v1 by itself, its gate
passing, the run Failed naming the check, the ERP told nothing, the file intact. (3) The
orchestrator killed (kill -9) between the switch and the gate: the rerun finishes the update
from the host's record, on v2 with the gate passing, a bootable system disk throughout.

Each test rolls out its own store first (the lab switches a test's machines off after it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.prefect_access import PrefectAccess
from lab.state import VENV_BIN, LabInfo, LabPaths
from store_rollout.contracts import (
    ERP_STORE_IMAGE_UPDATED,
    FIRSTBOOT_STAGE_DONE,
    FIRSTBOOT_STAGE_GRAIN,
    IMAGE_VERSION_GRAIN,
)
from tasks.salt import SaltMasterClient
from tests.helpers import (
    Background,
    created_erp_notices,
    finish,
    go_live_table,
    start_rollout,
    wait_for,
    write_inventory,
)

pytestmark = pytest.mark.lab

OK, GATE, KILLED = "u-ok", "u-gate", "u-kill"
MARKER = ("srv/store", "till-journal.txt")


def live(lab: LabInfo, lab_env: dict[str, str], inventory: Path, store_id: str) -> Path:
    """A live store on v1 (rolled out by the CLI), for this test alone: after each lab test
    the lab switches its machines off (tests/conftest.py)."""
    finish(start_rollout(lab_env, store_id, inventory))
    return inventory


@pytest.fixture
def update(lab: LabInfo, lab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """store_image_update in this process (so a step listener can act), against the lab."""
    monkeypatch.setenv("STORE_ROLLOUT_SETTINGS_FILE", str(LabPaths(lab_dir).settings_file))
    with PrefectAccess.of(lab).settings():
        from flows.image_update import store_image_update

        def run(store_id: str, inventory: Path, **params: Any) -> Any:
            return store_image_update(store_id, str(inventory), return_state=True, **params)

        yield run


def vm(store_id: str) -> str:
    return f"store-{store_id}-vm"


def version(master: SaltMasterClient, store_id: str) -> str:
    return str(master.cmd(vm(store_id), "grains.get", [IMAGE_VERSION_GRAIN]))


def write_marker(master: SaltMasterClient, store_id: str, text: str) -> str:
    """A file on the store's data disk, written by the VM's minion (as the store server
    would); its path on the VM."""
    path = str(master.cmd(vm(store_id), "provisioning.root_path", list(MARKER)))
    assert master.cmd(vm(store_id), "file.write", [path, text])
    return path


def read_marker(master: SaltMasterClient, store_id: str, path: str) -> str:
    return str(master.cmd(vm(store_id), "file.read", [path]))


def updated_notices(lab: LabInfo, store_id: str) -> list[dict[str, Any]]:
    return [n for n in created_erp_notices(lab, store_id)
            if n["payload"].get("status") == ERP_STORE_IMAGE_UPDATED]


def update_record(lab: LabInfo, store_id: str) -> dict[str, Any] | None:
    path = Path(lab.vm_images_dir) / vm(store_id) / "update.json"
    return json.loads(path.read_text()) if path.exists() else None


def domain_disk(lab: LabInfo, store_id: str) -> str:
    import xml.etree.ElementTree as ET

    import libvirt

    conn = libvirt.open(lab.libvirt_uri)
    try:
        root = ET.fromstring(conn.lookupByName(vm(store_id)).XMLDesc(0))
    finally:
        conn.close()
    source = root.find("./devices/disk[@device='disk']/source")
    assert source is not None
    return str(source.get("file"))


@pytest.mark.extended
def test_an_update_to_v2_keeps_the_vms_identity_and_data(lab: LabInfo, lab_env: dict[str, str],
                                                         update: Any, tmp_path: Path) -> None:
    inv = live(lab, lab_env, write_inventory(tmp_path / "inv.yaml", ["u-ok"], "52:54:00:47:01",
                                             lab=lab), OK)
    master = SaltMasterClient(lab.salt_master_config)
    assert version(master, OK) == "v1"
    keys_before = master.fingerprints(vm(OK))
    path = write_marker(master, OK, "sale 1: 4.20 EUR")
    written = read_marker(master, OK, path)
    state = update(OK, inv, image_version="v2")
    assert state.is_completed(), state.message
    result = state.result()
    assert (result["outcome"], result["from_version"], result["to_version"]) == (
        "updated", "v1", "v2")
    assert result["downtime_seconds"] > 0, result
    # the VM says so (not the run), as the same minion with the same key
    assert version(master, OK) == "v2"
    assert master.fingerprints(vm(OK)) == keys_before
    assert master.key_state(vm(OK)) == "accepted"
    assert read_marker(master, OK, path) == written and "sale 1: 4.20 EUR" in written
    assert domain_disk(lab, OK) == result["disk"] and Path(result["disk"]).exists()
    assert (update_record(lab, OK) or {}).get("phase") == "committed"
    # the new system disk knows its store is past firstboot: a rollout's rerun does not wait
    assert master.cmd(vm(OK), "grains.get", [FIRSTBOOT_STAGE_GRAIN]) == FIRSTBOOT_STAGE_DONE
    assert {row["result"] for row in go_live_table(lab, OK)} == {"pass"}
    assert len(updated_notices(lab, OK)) == 1
    # run again: already there, nothing touched (no shutdown, no second notice)
    again = update(OK, inv, image_version="v2")
    assert again.is_completed(), again.message
    assert again.result()["outcome"] == "already"
    assert "shutdown" not in again.result()["step_seconds"]
    assert len(updated_notices(lab, OK)) == 1
    assert domain_disk(lab, OK) == result["disk"]


@pytest.mark.extended
def test_a_gate_failing_on_v2_reverts_to_v1_by_itself(lab: LabInfo, lab_env: dict[str, str],
                                                      update: Any, tmp_path: Path) -> None:
    inv = live(lab, lab_env, write_inventory(tmp_path / "inv.yaml", ["u-gate"], "52:54:00:47:02",
                                             lab=lab), GATE)
    master = SaltMasterClient(lab.salt_master_config)
    path = write_marker(master, GATE, "sale 7: 12.00 EUR")
    written = read_marker(master, GATE, path)
    disk_before = domain_disk(lab, GATE)
    actions = Background()

    def service_dies() -> None:  # the new version's store service dies as its gate starts
        assert master.cmd(vm(GATE), "service.stop", ["store-pos-gateway"]) is True

    with actions.on_step("go_live", service_dies):
        state = update(GATE, inv, image_version="v2")
    actions.join()
    assert state.is_failed()
    message = str(state.message)
    assert f"store {GATE}: image update to v2 failed on the new version and was reverted to " \
           "v1 (its go-live gate passes; the ERP was not notified): the go-live gate failed" \
           in message, message
    assert "service pos_gateway (store-pos-gateway) runs: not running" in message, message
    assert "reverted to v1" in message and "the ERP was not notified" in message, message
    # back on v1 by itself, its gate passing, its data intact; the ERP heard nothing
    assert version(master, GATE) == "v1"
    assert domain_disk(lab, GATE) == disk_before
    assert (update_record(lab, GATE) or {}).get("phase") == "reverted"
    assert {row["result"] for row in go_live_table(lab, GATE)} == {"pass"}
    assert read_marker(master, GATE, path) == written
    assert updated_notices(lab, GATE) == []


@pytest.mark.fleet  # a killed run's resume, like the fleet tier's others (make test-fleet)
def test_an_update_killed_between_switch_and_gate_is_finished_by_its_rerun(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    inv = live(lab, lab_env, write_inventory(tmp_path / "inv.yaml", ["u-kill"], "52:54:00:47:03",
                                             lab=lab), KILLED)
    command = [str(VENV_BIN / "store-rollout"), "update", KILLED, "--image", "v2",
               "--inventory", str(inv), "--yes"]
    log = tmp_path / "killed.log"
    proc = subprocess.Popen(command, env=lab_env, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), text=True, start_new_session=True)
    try:  # killed as soon as the host recorded the switch (before the boot and the gate)
        wait_for(lambda: (update_record(lab, KILLED) or {}).get("phase") == "switched",
                 timeout=180, interval=0.2, what="the switch recorded on the host")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (update_record(lab, KILLED) or {}).get("phase") == "switched", log.read_text()[-3000:]
    # never without a bootable system disk: the domain's disk is there, whichever it is
    assert Path(domain_disk(lab, KILLED)).exists()
    rerun = subprocess.Popen(command, env=lab_env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    result = finish(rerun)  # waits out the killed run's store slot (its lease)
    assert result["resumed"] is True and result["outcome"] == "updated", result
    master = SaltMasterClient(lab.salt_master_config)
    assert version(master, KILLED) == "v2"
    assert (update_record(lab, KILLED) or {}).get("phase") == "committed"
    assert {row["result"] for row in go_live_table(lab, KILLED)} == {"pass"}
    assert len(updated_notices(lab, KILLED)) == 1
