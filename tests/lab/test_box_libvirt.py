"""Issue 48: a store box racked with a libvirtd of its own (lab/boxes.py). The store rolls out onto
that box: its VM is on the box's libvirtd (not the lab's shared one), the box's minion drives it,
and the box's power cut through its BMC takes the domain and the VM's minion with it. A second box
of the store, racked the same way, listens on libvirt's TLS port at its address on the store
network: the first box reaches it there, and before the master's CA signed both boxes' keys its
certificate is refused (nothing migrates before the trust is set up)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from lab.boxes import own_box, power_cut, power_on
from lab.hardware import box_info, rack, rack_inventory, unrack
from lab.simulator.minions import MinionManager
from lab.state import LabInfo, LabPaths
from lab.store_network import StoreNetwork
from store_rollout.contracts import LIBVIRT_TLS_PORT
from tasks.salt import SaltMasterClient
from tests.helpers import bmc_power, finish, start_rollout, wait_for, write_inventory

pytestmark = pytest.mark.lab

STORE = "bl1"
HV, VM = f"store-{STORE}-hv", f"store-{STORE}-vm"
SECOND_MAC = "52:54:00:48:a1:01"
SECOND = f"{HV}-48a101"


def virsh(uri: str, *args: str, netns_pid: int | None = None,
          mount_ns_pid: int | None = None) -> subprocess.CompletedProcess[str]:
    enter = []
    if netns_pid is not None or mount_ns_pid is not None:
        enter = ["nsenter"]
        if mount_ns_pid is not None:
            enter += [f"--mount=/proc/{mount_ns_pid}/ns/mnt"]
        if netns_pid is not None:
            enter += [f"--net=/proc/{netns_pid}/ns/net"]
        enter += ["--"]
    return subprocess.run([*enter, "virsh", "-c", uri, *args], capture_output=True, text=True,
                          check=False, timeout=60)


def domains(uri: str) -> list[str]:
    proc = virsh(uri, "list", "--all", "--name")
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.split() if line]


def test_a_box_with_its_own_libvirtd_runs_its_store_and_reaches_its_second_box_on_tls(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", [STORE], "52:54:00:48:a0")
    raw = yaml.safe_load(inventory.read_text())
    raw["stores"][0]["hypervisor"]["platform"] = "sle16-kvm"
    inventory.write_text(yaml.safe_dump(raw))
    rack_inventory(lab, inventory, own_libvirt=True)
    try:
        check_rollout_and_power_cut(lab, lab_env, inventory)
    finally:
        second = own_box(lab.state_dir, SECOND, lab.vm_images_dir)
        if second is not None:
            power_cut(second)
        unrack(lab, STORE, SECOND)
        unrack(lab, STORE)


def check_rollout_and_power_cut(lab: LabInfo, lab_env: dict[str, str], inventory: Path) -> None:
    result = finish(start_rollout(lab_env, STORE, inventory))
    assert result["state"] == "Completed", result
    box = box_info(lab, HV)
    assert box is not None and box.running and box.address, box
    # the VM on the box's own libvirtd, which the box's minion drives; none on the shared one
    assert VM in domains(box.uri)
    assert VM not in domains(lab.libvirt_uri)
    master = SaltMasterClient(lab.salt_master_config)
    assert master.cmd(HV, "config.get", ["virt:connection:uri"]) == box.uri
    assert master.cmd(HV, "config.get", ["storevirt:pki_dir"]) == str(box.pki_dir)
    summary = master.cmd(HV, "storevirt.domain_summary", [VM])
    assert summary["active"], summary
    # its disks in the box's own images dir, named by the lab's common path (as two hosts both
    # have /srv/salt-images)
    assert summary["data_disk"].startswith(lab.vm_images_dir), summary
    local = box.images_dir / Path(summary["data_disk"]).relative_to(lab.vm_images_dir)
    assert local.exists() and not Path(summary["data_disk"]).exists()
    assert master.ping(VM, timeout=5)

    check_second_box_on_tls(lab, box.netns_pid, box.address)

    # the box's power cut (its BMC): its libvirtd, its domains and its VM's minion go with it
    bmc_power(lab, HV, "off")
    wait_for(lambda: not box_info(lab, HV).running, timeout=60,  # type: ignore[union-attr]
             what=f"{HV}'s libvirtd stopped by its power cut")
    wait_for(lambda: not master.ping(VM, timeout=2), timeout=60,
             what=f"{VM}'s minion gone with its box's power")
    running = requests.get(f"{lab.simulator_url}/minions", timeout=10).json()["running"]
    assert not running.get(VM, {}).get("alive"), running
    assert virsh(box.uri, "list").returncode != 0  # no libvirtd answers on the box's socket


def check_second_box_on_tls(lab: LabInfo, first_netns: int | None, first_address: str) -> None:
    """A second box of the store with its own libvirtd up (its OS's libvirtd, started as the
    simulator starts it at a boot; no install: the refresh flow installs it), reached from the
    first box's libvirtd namespace on TLS: it answers, and refuses the first box's client
    certificate, which the master's CA has not signed (nor has it signed the second's)."""
    rack(lab, STORE, SECOND_MAC, "redfish", name=SECOND, own_libvirt=True)
    second = own_box(lab.state_dir, SECOND, lab.vm_images_dir)
    assert second is not None
    minions = MinionManager(LabPaths(Path(lab.state_dir)), lab)
    address = minions.address(SECOND)
    assert address != first_address
    power_on(second, network=StoreNetwork.load(Path(lab.store_network_state)),
             minion_id=SECOND, address=address,
             simulator_url=minions.network().url(minions.simulator_port),
             logs=Path(lab.state_dir) / "logs")
    info = box_info(lab, SECOND)
    assert info is not None and info.running and info.tls_uri == f"qemu+tls://{address}/system"
    first = box_info(lab, HV)
    assert first is not None
    first_libvirtd = own_box(lab.state_dir, HV, lab.vm_images_dir).record("libvirtd")  # type: ignore[union-attr]
    assert first_libvirtd is not None
    # from the first box's libvirtd namespace: its /etc/pki is the first box's own PKI dir, the
    # client certificate it would present to a migration peer
    proc = virsh(info.tls_uri, "list", netns_pid=first_netns, mount_ns_pid=first_libvirtd.pid)
    said = proc.stderr.lower()
    assert proc.returncode != 0, proc.stdout
    assert "certificate" in said and "connection refused" not in said, proc.stderr
    # the port is the box's TLS port on its address: nothing listens there in the lab's own
    # network namespace (the boxes are on the store network only)
    assert f"{address}:{LIBVIRT_TLS_PORT}" not in subprocess.run(
        ["ss", "-ltnH"], capture_output=True, text=True, check=False).stdout
    listening = subprocess.run(["nsenter", f"--net=/proc/{info.netns_pid}/ns/net", "ss", "-ltnH"],
                               capture_output=True, text=True, check=False).stdout
    assert f"{address}:{LIBVIRT_TLS_PORT}" in listening, listening
