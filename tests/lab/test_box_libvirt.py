"""Issue 48: a store box racked with a libvirtd of its own (lab/boxes.py). The store rolls out onto
that box: its VM is on the box's libvirtd (not the lab's shared one), the box's minion drives it,
and the box's power cut through its BMC takes the domain and the VM's minion with it. A second box
of the store, racked the same way, listens on libvirt's TLS port at its address on the store
network: the first box reaches it there, and before the master's CA signed both boxes' keys its
certificate is refused (nothing migrates before the trust is set up). Once a CA signed both
boxes' keys (as storevirt.tls_install will), the VM live-migrates to the second box over TLS
without a reboot (the same minion process and /srv/store), its clean stop there writes the
second box's data.raw, it boots there from it, and migrates back.

In the fleet tier (`make test-fleet`): the default tier's test_hardware_refresh.py moves two
stores between such boxes through the pipeline itself (live and offline, over the master's CA);
this one checks the lab's boxes alone, what the refresh test does not (the TLS refusal before
trust, a boot from the new box's data.raw, the way back)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import requests
import yaml

from lab import box_libvirt
from lab.boxes import own_box, power_cut, power_on
from lab.hardware import BoxInfo, box_info, rack, rack_inventory, unrack
from lab.simulator.data_disk import MOUNTED_MARKER, data_disk_of
from lab.simulator.minions import MinionManager
from lab.state import LabInfo, LabPaths
from lab.store_network import StoreNetwork
from store_rollout.contracts import LIBVIRT_TLS_PORT
from tasks.salt import SaltMasterClient
from tests.helpers import bmc_power, finish, start_rollout, wait_for, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.fleet]

STORE = "bl1"
HV, VM = f"store-{STORE}-hv", f"store-{STORE}-vm"
SECOND_MAC = "52:54:00:48:a1:01"
SECOND = f"{HV}-48a101"
RECEIPT = "receipt 0001: 3 x bread, paid"  # file.write ends it with a newline


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
        check_rollout_and_power_cut(lab, lab_env, inventory, tmp_path)
    finally:
        second = own_box(lab.state_dir, SECOND, lab.vm_images_dir)
        if second is not None:
            power_cut(second)
        unrack(lab, STORE, SECOND)
        unrack(lab, STORE)


def check_rollout_and_power_cut(lab: LabInfo, lab_env: dict[str, str], inventory: Path,
                                tmp_path: Path) -> None:
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

    second = check_second_box_on_tls(lab, box.netns_pid, box.address)
    check_live_migration_keeps_the_vm_running(lab, master, tmp_path, box, second)

    # the box's power cut (its BMC): its libvirtd, its domains and its VM's minion go with it
    bmc_power(lab, HV, "off")
    wait_for(lambda: not box_info(lab, HV).running, timeout=60,  # type: ignore[union-attr]
             what=f"{HV}'s libvirtd stopped by its power cut")
    wait_for(lambda: not master.ping(VM, timeout=2), timeout=60,
             what=f"{VM}'s minion gone with its box's power")
    running = requests.get(f"{lab.simulator_url}/minions", timeout=10).json()["running"]
    assert not running.get(VM, {}).get("alive"), running
    assert virsh(box.uri, "list").returncode != 0  # no libvirtd answers on the box's socket


def check_second_box_on_tls(lab: LabInfo, first_netns: int | None,
                            first_address: str) -> BoxInfo:
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
    return info


def trust(tmp_path: Path, *boxes: BoxInfo) -> None:
    """What storevirt.tls_install does on each box, with a test CA: the box's own key's CSR
    signed (CN its minion id, SAN its address), the CA and certificate where libvirt reads
    them, then the box's libvirtd rereads them."""
    ca_key, ca = tmp_path / "ca.key", tmp_path / "ca.pem"
    openssl = ["openssl"]
    subprocess.run([*openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(ca_key), "-out", str(ca), "-subj", "/O=store-rollout/CN=test CA"],
                   check=True, capture_output=True)
    for box in boxes:
        csr, ext, cert = (tmp_path / f"{box.name}.{x}" for x in ("csr", "ext", "pem"))
        subprocess.run([*openssl, "req", "-new", "-key",
                        str(box.pki_dir / "libvirt/private/serverkey.pem"),
                        "-subj", f"/O=store-rollout/CN={box.minion_id}", "-out", str(csr)],
                       check=True, capture_output=True)
        ext.write_text(f"subjectAltName=IP:{box.address}\nextendedKeyUsage=serverAuth,clientAuth\n"
                       "keyUsage=digitalSignature,keyEncipherment\nbasicConstraints=critical,CA:FALSE\n")
        subprocess.run([*openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey",
                        str(ca_key), "-CAcreateserial", "-days", "1", "-extfile", str(ext),
                        "-out", str(cert)], check=True, capture_output=True)
        (box.pki_dir / "CA" / "cacert.pem").write_bytes(ca.read_bytes())
        for name in ("servercert.pem", "clientcert.pem"):
            (box.pki_dir / "libvirt" / name).write_bytes(cert.read_bytes())
        subprocess.run(box_libvirt.reload_tls_argv(box.dir), check=True, capture_output=True)


def precreate(vm_xml: str, source: BoxInfo, target: BoxInfo, common: Path) -> None:
    """The VM's disk files on the target box at the same paths (storevirt.prepare_incoming's
    work): a qcow2 overlay on the same base image (copied there with its meta.json; `-u`: the
    base is named by the common path, which only the box sees), a raw file
    of the same size, the CD-ROM's file as it is."""
    for disk in ET.fromstring(vm_xml).iterfind("./devices/disk"):
        src = disk.find("source")
        if src is None or not src.get("file"):
            continue
        rel = Path(src.get("file", "")).relative_to(common)
        there, here = target.images_dir / rel, source.images_dir / rel
        there.parent.mkdir(parents=True, exist_ok=True)
        if disk.get("device") == "cdrom":
            shutil.copyfile(here, there)
            continue
        info = json.loads(subprocess.run(["qemu-img", "info", "--force-share", "--output=json",
                                          str(here)], check=True, capture_output=True,
                                         text=True).stdout)
        backing = info.get("full-backing-filename") or info.get("backing-filename")
        if backing:
            base_rel = Path(backing).relative_to(common)
            if not (target.images_dir / base_rel).exists():
                shutil.copytree(source.images_dir / base_rel.parent,
                                target.images_dir / base_rel.parent)
            subprocess.run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-F", "qcow2", "-b",
                            backing, str(there), str(info["virtual-size"])], check=True)
        else:
            with open(there, "wb") as out:
                out.truncate(info["virtual-size"])


def migrate(source: BoxInfo, target: BoxInfo, vm: str) -> float:
    import libvirt

    conn = libvirt.open(source.uri)
    try:
        started = time.monotonic()
        # the destination's address for the memory and the disks' streams: libvirt would
        # otherwise connect its NBD stream to the destination's hostname (every lab box has the
        # lab machine's)
        dest = f"tcp://{target.address}"
        params = {libvirt.VIR_MIGRATE_PARAM_URI: dest, libvirt.VIR_MIGRATE_PARAM_DISKS_URI: dest}
        conn.lookupByName(vm).migrateToURI3(target.tls_uri, params, (
            libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
            | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            | libvirt.VIR_MIGRATE_NON_SHARED_INC))
        return time.monotonic() - started
    finally:
        conn.close()


def minion_pid(lab: LabInfo, minion_id: str) -> int | None:
    running = requests.get(f"{lab.simulator_url}/minions", timeout=10).json()["running"]
    entry = running.get(minion_id) or {}
    return entry.get("pid") if entry.get("alive") else None


def debugfs_cat(disk: Path, path: str) -> str:
    return subprocess.run(["debugfs", "-R", f"cat {path}", str(disk)], capture_output=True,
                          text=True, check=False).stdout


def check_live_migration_keeps_the_vm_running(lab: LabInfo, master: SaltMasterClient,
                                              tmp_path: Path, first: BoxInfo,
                                              second: BoxInfo) -> None:
    """Over TLS with both boxes trusted: the VM live-migrates to the second box without a
    reboot (the same minion process, its /srv/store as it was), its next clean stop writes
    /srv/store into the second box's data.raw (not the first's), it boots there from that
    disk, and migrates back."""
    import libvirt

    common = Path(lab.vm_images_dir)
    trust(tmp_path, first, second)
    store_dir = master.cmd(VM, "provisioning.root_path", ["srv", "store"])
    master.cmd(VM, "file.write", [f"{store_dir}/receipts.txt", RECEIPT])
    pid = minion_pid(lab, VM)
    assert pid
    conn = libvirt.open(first.uri)
    xml = conn.lookupByName(VM).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    conn.close()
    precreate(xml, first, second, common)
    seconds = migrate(first, second, VM)
    assert VM in domains(second.uri) and VM not in domains(first.uri)
    data = Path(data_disk_of(ET.fromstring(xml)) or "")
    marker = LabPaths(Path(lab.state_dir)).simulator / "minions" / VM / MOUNTED_MARKER
    wait_for(lambda: marker.read_text() == str(second.images_dir / data.relative_to(common)),
             timeout=30, what=f"{VM}'s data disk re-homed to {second.name}")
    assert minion_pid(lab, VM) == pid, "a live migration does not reboot the guest"
    assert master.cmd(VM, "file.read", [f"{store_dir}/receipts.txt"]) == RECEIPT + "\n"
    print(f"live migration {first.name} -> {second.name}: {seconds:.1f} s")

    # a clean stop on the second box: the guest's writes land in the second box's data.raw
    assert virsh(second.uri, "shutdown", VM).returncode == 0
    wait_for(lambda: VM not in virsh(second.uri, "list", "--name").stdout, timeout=60,
             what=f"{VM} shut down on {second.name}")
    assert debugfs_cat(second.images_dir / data.relative_to(common),
                       "/receipts.txt") == RECEIPT + "\n"
    assert "receipt" not in debugfs_cat(first.images_dir / data.relative_to(common),
                                         "/receipts.txt")
    # it boots there from that disk, then migrates back
    assert virsh(second.uri, "start", VM).returncode == 0
    wait_for(lambda: master.ping(VM, timeout=3), timeout=90, what=f"{VM} booted on {second.name}")
    assert master.cmd(VM, "file.read", [f"{store_dir}/receipts.txt"]) == RECEIPT + "\n"
    pid = minion_pid(lab, VM)
    migrate(second, first, VM)
    assert VM in domains(first.uri) and VM not in domains(second.uri)
    wait_for(lambda: marker.read_text() == str(first.images_dir / data.relative_to(common)),
             timeout=30, what=f"{VM}'s data disk re-homed back to {first.name}")
    assert minion_pid(lab, VM) == pid
