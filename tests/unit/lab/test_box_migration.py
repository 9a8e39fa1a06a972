"""A store VM's move between two store boxes' own libvirtds (lab/box_libvirt.py) over libvirt's
real TLS transport, with certificates the master's CA (tasks/libvirt_tls.py) signed for each
box's own key through storevirt.tls_request / tls_install, each storevirt call made by Salt
3006.0's loader under the store host's Python 3.6 in the box's namespaces: live (KVM's path,
migrate_live), offline (Xen's path: send_disks, interrupted and resumed, disks_sha256,
define_incoming, release_moved), and the refusals: a box whose certificate is not the master
CA's, another store's box (its libvirtd's tls_allowed_dn_list), and move_store_vm's own check
before anything moves.

All in a fresh `unshare --net` namespace (127.0.0.2-4 on its loopback); no lab services. Each
box's images dir is bound over one common path in its libvirtd's mount namespace and in its
minion's calls, as two hosts hold the same path."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import box_libvirt
from lab.procs import ProcessRecord, stop
from store_rollout.contracts import DATA_DISK_FILE, MOVE_RECORD_FILE
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from store_rollout.settings_refresh import RefreshPart
from tasks.box_move import MoveRefused, move_store_vm
from tasks.libvirt_tls import sign
from tests.unit.salt_states.test_host_python36 import ok, run_on_host_python

pytestmark = pytest.mark.lab  # starts three libvirtds and a QEMU guest

STORE, OTHER = "t48", "t49"
VM = f"store-{STORE}-vm"
PAYLOAD = "till journal of store t48\n" * 50
CHUNK = 4 << 20  # storevirt's upload chunk (store_vm_move.CHUNK)


@dataclass
class Box:
    name: str  # its hypervisor minion id
    store_id: str
    address: str
    dir: Path
    record: ProcessRecord | None = None

    @property
    def images(self) -> Path:
        return self.dir / "images"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    def uri(self) -> str:
        return box_libvirt.uri(self.dir)


def calls(box: Box, holder: int, common: Path, tmp: Path,
          *funs: tuple[str, list[Any]] | tuple[str, list[Any], dict[str, Any]]) -> list[Any]:
    """storevirt on `box` as its minion runs it: in the box's network namespace, its images dir
    at the common path."""
    prefix = ("nsenter", f"--net=/proc/{holder}/ns/net", "--", "unshare", "--mount",
              "--propagation", "private", "--", "sh", "-c",
              f'mount --bind "{box.images}" "{common}" && exec "$@"', "sh")
    opts = {"id": box.name, "master": "127.0.0.1",
            "virt": {"connection": {"uri": box.uri()}, "images": str(common)},
            "storevirt": {"pki_dir": str(box.pki), "address": box.address,
                          "tls_reload": box_libvirt.reload_tls_argv(box.dir)}}
    work = tmp / f"minion-{box.name}"
    work.mkdir(exist_ok=True)
    return run_on_host_python(work, [{"fun": f[0], "args": f[1], "kwargs": f[2] if len(f) > 2
                                      else {}} for f in funs],
                              extra_opts=opts, argv_prefix=prefix)


def trust(box: Box, ca_dir: Path, holder: int, common: Path, tmp: Path) -> None:
    """The master's CA signs the box's own key (tasks/libvirt_tls.py), the box installs it."""
    request = ok(calls(box, holder, common, tmp, ("storevirt.tls_request", []))[0])
    cert = sign(ca_dir, request["csr"], box.name, request["address"], 90)
    from tasks.libvirt_tls import ca_pem

    installed = ok(calls(box, holder, common, tmp,
                         ("storevirt.tls_install", [ca_pem(ca_dir), cert]))[0])
    assert installed == {"changed": True, "reloaded": True}


def domain_xml(common: Path) -> str:
    return f"""<domain type='qemu'><name>{VM}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os><devices>
<emulator>/usr/bin/qemu-system-x86_64</emulator>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
<source file='{common}/{VM}/system.qcow2'/><target dev='vda' bus='virtio'/></disk>
<disk type='file' device='disk'><driver name='qemu' type='raw'/>
<source file='{common}/{VM}/{DATA_DISK_FILE}'/><target dev='vdb' bus='virtio'/></disk>
</devices></domain>"""


def debugfs_cat(disk: Path) -> str:
    return subprocess.run(["debugfs", "-R", "cat /journal.txt", str(disk)], capture_output=True,
                          text=True, check=True).stdout


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nonzero_chunk_bytes(path: Path) -> int:
    data = path.read_bytes()
    return sum(len(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)
               if data[i:i + CHUNK].count(0) != len(data[i:i + CHUNK]))


def libvirt_domains(box: Box) -> dict[str, bool]:
    import libvirt

    conn = libvirt.open(box.uri())
    try:
        return {d.name(): bool(d.isActive()) for d in conn.listAllDomains()}
    finally:
        conn.close()


def qemu_pids(box: Box) -> list[int]:
    run = box.dir / "ns" / "run" / "libvirt" / "qemu"
    pids = []
    for pidfile in run.glob("*.pid") if run.is_dir() else []:
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(pidfile.read_text().strip()))
    return pids


def teardown(boxes: list[Box], holder: subprocess.Popen[bytes]) -> None:
    """Domains destroyed first (their QEMU outlives libvirtd's SIGTERM), then the libvirtds,
    then any QEMU left, by PID, and the namespace's holder."""
    import libvirt

    pids = [pid for box in boxes for pid in qemu_pids(box)]
    for box in boxes:
        with contextlib.suppress(libvirt.libvirtError):
            conn = libvirt.open(box.uri())
            for dom in conn.listAllDomains():
                with contextlib.suppress(libvirt.libvirtError):
                    if dom.isActive():
                        dom.destroy()
            conn.close()
    for box in boxes:
        if box.record is not None:
            stop(box.record)
    for pid in pids + [pid for box in boxes for pid in qemu_pids(box)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    holder.kill()
    holder.wait()


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[tuple[list[Box], int, Path]]:
    common = tmp_path / "common"
    common.mkdir()
    holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c",
                               "ip link set lo up && exec sleep 600"], start_new_session=True)
    made = [Box(f"store-{STORE}-hv", STORE, "127.0.0.2", tmp_path / "a"),
            Box(f"store-{STORE}-hv-b0b0b0", STORE, "127.0.0.3", tmp_path / "b"),
            Box(f"store-{OTHER}-hv", OTHER, "127.0.0.4", tmp_path / "c")]
    try:
        time.sleep(0.3)
        netns = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
        try:
            for box in made:
                box_libvirt.prepare(box.dir, box_name=box.name, store_id=box.store_id,
                                    address=box.address, images_dir=box.images,
                                    common_images=common, pki_dir=box.pki,
                                    simulator_url="http://127.0.0.1:9")
                box.record = box_libvirt.start(box.dir, box.dir / "libvirtd.out", netns)
        finally:
            os.close(netns)
        for box in made:
            box_libvirt.wait_ready(box.dir)
        # QEMU's capabilities, probed by the two that run the guest, at once
        probes = [threading.Thread(target=_probe, args=(box,)) for box in made[:2]]
        for probe in probes:
            probe.start()
        for probe in probes:
            probe.join()
        yield made, holder.pid, common
    finally:
        teardown(made, holder)


def _probe(box: Box) -> None:
    import libvirt

    conn = libvirt.open(box.uri())
    conn.getCapabilities()
    conn.close()


def stores(ids: tuple[str, str, str], macs: tuple[str, str, str]) -> list[Store]:
    return [Store.model_validate({"store_id": sid, "erp": {"site_code": sid.upper()},
                                  "hypervisor": {"hostname": f"hv.{sid}.example", "mac": mac,
                                                 "platform": "sle16-kvm"}})
            for sid, mac in zip(ids, macs, strict=True)]


def test_the_store_vm_moves_to_its_new_box_over_tls_and_nowhere_else(
        boxes: tuple[list[Box], int, Path], tmp_path: Path) -> None:
    (old, new, other), holder, common = boxes
    ca_dir = tmp_path / "master-ca"
    for box in (old, other):
        trust(box, ca_dir, holder, common, tmp_path)
    # the VM on the old box: a system overlay on a base both boxes hold, a raw data disk whose
    # ext4 holds the store's file
    for box in (old, new):
        base = box.images / "base" / "k48" / "image.qcow2"
        base.parent.mkdir(parents=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "32M"], check=True)
    vm_dir = old.images / VM
    vm_dir.mkdir()
    # its backing file named at the common path, where the box's minion and libvirtd see it
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b",
                    f"{common}/base/k48/image.qcow2", str(vm_dir / "system.qcow2"), "32M"],
                   check=True)
    data = vm_dir / DATA_DISK_FILE
    with data.open("wb") as handle:
        handle.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "STORE_DATA", str(data)], check=True)
    (tmp_path / "journal.txt").write_text(PAYLOAD)
    subprocess.run(["debugfs", "-w", "-R", f"write {tmp_path / 'journal.txt'} journal.txt",
                    str(data)], check=True, capture_output=True)
    import libvirt

    conn = libvirt.open(old.uri())
    conn.defineXML(domain_xml(common)).create()
    conn.close()
    state = ok(calls(old, holder, common, tmp_path, ("storevirt.move_state", [VM]))[0])
    assert state["running"] and [d["format"] for d in state["disks"]] == ["qcow2", "raw"]

    # REFUSED: the new box still presents its bootstrap certificate (not the master CA's)
    refused_bootstrap = calls(old, holder, common, tmp_path,
                              ("storevirt.migrate_live", [VM, new.address, new.name, 60]))[0]
    assert not refused_bootstrap["ok"] and "certificate" in refused_bootstrap["error"].lower(), \
        refused_bootstrap
    # REFUSED: another store's box, with the master CA's certificate: its DN list
    refused_other = calls(old, holder, common, tmp_path,
                          ("storevirt.migrate_live", [VM, other.address, other.name, 60]))[0]
    assert not refused_other["ok"], refused_other
    assert "not on the list of allowed clients" in (other.dir / "libvirtd.log").read_text()
    assert libvirt_domains(old) == {VM: True}
    assert libvirt_domains(new) == {} and libvirt_domains(other) == {}
    # REFUSED by move_store_vm before any call: another store's box, the old box itself
    old_store, other_store, same_box = stores((STORE, OTHER, STORE), (
        "52:54:00:48:0a:01", "52:54:00:49:0c:01", "52:54:00:48:0a:01"))
    nowhere = SaltSettings(salt_master_config=str(tmp_path / "no-master"),
                           salt_master_address="127.0.0.1")
    refresh = RefreshPart(libvirt_ca_dir=str(ca_dir), libvirt_cert_days=90,
                          refresh_move_timeout_seconds=60)
    for target, said in ((other_store, "not this store's new box"),
                         (same_box, "is the box the VM runs on")):
        with pytest.raises(MoveRefused, match=said):
            move_store_vm.fn(old_store, target, nowhere, refresh, other.address)
    assert libvirt_domains(old) == {VM: True}

    # (a) LIVE: the new box trusted, its disks precreated, the running VM migrates
    trust(new, ca_dir, holder, common, tmp_path)
    prepared, = calls(new, holder, common, tmp_path,
                      ("storevirt.prepare_incoming", [VM, state["disks"]]))
    assert len(ok(prepared)["created"]) == 2
    moved, after_old = calls(old, holder, common, tmp_path,
                             ("storevirt.migrate_live", [VM, new.address, new.name, 60]),
                             ("storevirt.move_state", [VM]))
    print("live migration:", ok(moved))
    assert ok(moved)["seconds"] > 0 and ok(moved)["bytes"] > 0, moved
    assert libvirt_domains(new) == {VM: True} and libvirt_domains(old) == {}
    record = ok(after_old)["record"]
    assert (record["to"], record["mode"], record["phase"]) == (new.name, "live", "moved")
    assert not ok(after_old)["defined"]
    assert debugfs_cat(new.images / VM / DATA_DISK_FILE) == PAYLOAD

    # the old box lets go of its copy; then (b) OFFLINE back to it, interrupted and resumed
    forgotten, = calls(old, holder, common, tmp_path, ("storevirt.forget_moved", [VM]))
    assert ok(forgotten) == {"undefined": False, "removed": True} and not (old.images / VM).exists()
    stopped, partial, record_then, rest, xml = calls(
        new, holder, common, tmp_path, ("storevirt.stop", [VM]),
        ("storevirt.send_disks", [VM, old.address, old.name], {"limit_bytes": CHUNK}),
        ("storevirt.move_state", [VM]),
        ("storevirt.send_disks", [VM, old.address, old.name]),
        ("storevirt.domain_xml", [VM]))
    assert ok(stopped) and not ok(partial)["complete"], partial
    copy = ok(record_then)["record"]
    data_at = f"{common}/{VM}/{DATA_DISK_FILE}"
    assert copy["phase"] == "copying" and 0 < copy["disks"][data_at]["offset"] < 64 << 20, copy
    assert ok(rest)["complete"] and ok(rest)["disks"][1]["bytes_sent"] > 0, rest
    new_data = new.images / VM / DATA_DISK_FILE
    first = {d["path"]: d["bytes_sent"] for d in ok(partial)["disks"]}
    # resumed, not started again: the chunks sent before are not sent twice
    assert first[data_at] + ok(rest)["disks"][1]["bytes_sent"] == nonzero_chunk_bytes(new_data)
    sent = {d["path"]: d["sha256"] for d in ok(rest)["disks"]}
    assert sent[data_at] == sha256(new_data)
    there, defined, released = calls(old, holder, common, tmp_path,
                                     ("storevirt.disks_sha256", [VM, sorted(sent)]),
                                     ("storevirt.define_incoming", [VM, ok(xml)]))[:2] + calls(
        new, holder, common, tmp_path, ("storevirt.release_moved", [VM]))
    assert ok(there) == sent
    assert ok(defined)["autostart"] and ok(released)["phase"] == "moved"
    assert libvirt_domains(new) == {} and libvirt_domains(old) == {VM: False}
    assert debugfs_cat(old.images / VM / DATA_DISK_FILE) == PAYLOAD
    assert (new.images / VM / MOVE_RECORD_FILE).exists()
    conn = libvirt.open(old.uri())
    conn.lookupByName(VM).create()
    conn.close()
    assert libvirt_domains(old) == {VM: True}
