"""The hypervisor's side of a refresh (issue 48): its libvirt TLS files (storevirt.tls_request,
tls_install, tls_status) with certificates of the master's CA (tasks/libvirt_tls.py), and the
move's record, preparation, definition and cleanup (move_state, prepare_incoming, domain_xml,
define_incoming, release_moved, forget_moved), called through Salt 3006.0's loader under the
store host's Python 3.6 (tests/host36/run_host_calls.py) with the host's `openssl`, real
qemu-img and libvirt's in-process test driver. The moves themselves, between two real
libvirtds over TLS: tests/unit/lab/test_box_migration.py."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from store_rollout.contracts import DATA_DISK_FILE, MOVE_RECORD_FILE
from tasks.libvirt_tls import LibvirtTlsRefused, ca_pem, ca_sha256, forget_address, sign, trusted
from tests.unit.salt_states.test_host_python36 import HV, VM, ok, run_on_host_python
from tests.unit.salt_states.test_storevirt_disks import domain_with_data_disk

NEW_HV = HV + "-a1b2c3"
INCOMING_UUID = "8f4e0c36-1d48-4a48-9c39-000000000039"


def tls_opts(tmp: Path, address: str = "192.0.2.7") -> dict[str, Any]:
    return {"storevirt": {"pki_dir": str(tmp / "pki"), "address": address,
                          "tls_reload": ["touch", str(tmp / "reloaded")]}}


def new_csr(cn: str) -> str:
    """A CSR for a key of its own (another box's)."""
    return subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout",
                           "/dev/null", "-subj", f"/O=store-rollout/CN={cn}"],
                          capture_output=True, text=True, check=True).stdout


def test_a_box_gets_a_certificate_of_the_masters_ca_for_its_own_key(tmp_path: Path) -> None:
    ca_dir, pki = tmp_path / "ca", tmp_path / "pki"
    opts = tls_opts(tmp_path)
    none, request, again = run_on_host_python(tmp_path, [
        {"fun": "storevirt.tls_status"}, {"fun": "storevirt.tls_request"},
        {"fun": "storevirt.tls_request"}], extra_opts=opts)
    assert ok(none) is None
    key = pki / "libvirt/private/serverkey.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    csr = x509.load_pem_x509_csr(ok(request)["csr"].encode())
    assert csr.subject.rfc4514_string() == f"CN={HV},O=store-rollout"
    assert ok(request)["address"] == "192.0.2.7"
    # the key is made once: a second request is for the same key
    assert x509.load_pem_x509_csr(ok(again)["csr"].encode()).public_key() == csr.public_key()
    cert = sign(ca_dir, ok(request)["csr"], HV, "192.0.2.7", 90)
    assert stat.S_IMODE(ca_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((ca_dir / "ca.key").stat().st_mode) == 0o600
    # another CA's certificate for this key, and this CA's for another key: refused
    other_ca = tmp_path / "other-ca"
    foreign = sign(other_ca, ok(request)["csr"], HV, "192.0.2.7", 90)
    not_mine = sign(ca_dir, new_csr(HV), HV, "192.0.2.7", 90)
    wrong_ca, wrong_key, installed, unchanged, status = run_on_host_python(tmp_path, [
        {"fun": "storevirt.tls_install", "args": [ca_pem(ca_dir), foreign]},
        {"fun": "storevirt.tls_install", "args": [ca_pem(ca_dir), not_mine]},
        {"fun": "storevirt.tls_install", "args": [ca_pem(ca_dir), cert]},
        {"fun": "storevirt.tls_install", "args": [ca_pem(ca_dir), cert]},
        {"fun": "storevirt.tls_status"}], extra_opts=opts)
    assert not wrong_ca["ok"] and "not signed by the CA given" in wrong_ca["error"], wrong_ca
    assert not wrong_key["ok"] and "not for this host's key" in wrong_key["error"], wrong_key
    assert ok(installed) == {"changed": True, "reloaded": True}
    assert (tmp_path / "reloaded").exists()
    assert ok(unchanged) == {"changed": False, "reloaded": False}
    found = ok(status)
    assert (found["subject_cn"], found["san"], found["verified"]) == (HV, ["192.0.2.7"], True)
    assert found["ca_sha256"] == ca_sha256(ca_dir) and trusted(found, HV, "192.0.2.7", ca_dir)
    assert not trusted(found, HV, "192.0.2.8", ca_dir) and not trusted(found, NEW_HV, "192.0.2.7",
                                                                        ca_dir)
    assert not trusted(found, HV, "192.0.2.7", other_ca)
    for path in ("CA/cacert.pem", "libvirt/servercert.pem", "libvirt/clientcert.pem",
                 "libvirt/client/cacert.pem", "libvirt/client/clientcert.pem"):
        assert (pki / path).read_text() in (cert, ca_pem(ca_dir)), path
    for path in ("libvirt/private/clientkey.pem", "libvirt/client/clientkey.pem"):
        assert (pki / path).read_text() == key.read_text()
        assert stat.S_IMODE((pki / path).stat().st_mode) == 0o600
    # the address is this box's now: another box may not have it, until it is retired
    new_box = new_csr(NEW_HV)
    with pytest.raises(LibvirtTlsRefused, match="192.0.2.7 is store-0036-hv's"):
        sign(ca_dir, new_box, NEW_HV, "192.0.2.7", 90)
    assert forget_address(ca_dir, HV) == ["192.0.2.7"]
    assert "BEGIN CERTIFICATE" in sign(ca_dir, new_box, NEW_HV, "192.0.2.7", 90)


def test_the_ca_refuses_what_it_should_not_sign(tmp_path: Path) -> None:
    csr = new_csr(NEW_HV)
    ca_dir = tmp_path / "ca"
    for minion, address, said in ((HV, "192.0.2.9", "names another CN"),
                                  ("store-0036-vm", "192.0.2.9", "no store hypervisor's"),
                                  (NEW_HV, "box.example", "not an IP address")):
        with pytest.raises(LibvirtTlsRefused, match=said):
            sign(ca_dir, csr, minion, address, 30)
    cert = x509.load_pem_x509_certificate(sign(ca_dir, csr, NEW_HV, "192.0.2.9", 30).encode())
    assert cert.subject.rfc4514_string() == f"CN={NEW_HV},O=store-rollout"
    assert json.loads((ca_dir / "issued.json").read_text()) == {"192.0.2.9": NEW_HV}


def test_the_move_record_preparation_definition_and_cleanup(tmp_path: Path) -> None:
    images = tmp_path / "images"
    base = images / "base" / ("c3" * 20) / "image.qcow2"
    base.parent.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    system, data = images / VM / "system.qcow2", images / VM / DATA_DISK_FILE
    incoming = "store-0039-vm"
    moved = [{"path": str(images / incoming / "system.qcow2"), "format": "qcow2",
              "virtual_size": 16 << 20, "backing": str(base), "backing_format": "qcow2"},
             {"path": str(images / incoming / DATA_DISK_FILE), "format": "raw",
              "virtual_size": 1 << 30, "backing": None}]
    lost = dict(moved[0], path=str(images / "store-0040-vm" / "system.qcow2"),
                backing=str(tmp_path / "gone.qcow2"))
    outside = dict(moved[1], path=str(tmp_path / "elsewhere.raw"))
    xml_in = domain_with_data_disk(Path(moved[0]["path"]), Path(moved[1]["path"])).replace(
        VM, incoming).replace("</name>", f"</name><uuid>{INCOMING_UUID}</uuid>", 1)
    calls = [
        {"fun": "storevirt.create_overlay", "args": [VM, str(base)]},
        {"fun": "storevirt.create_data_disk", "args": [VM, 1]},
        {"fun": "storevirt.move_state", "args": [VM]},
        {"fun": "storevirt.prepare_incoming", "args": [VM, []]},
        {"fun": "storevirt.define_incoming", "args": [incoming, xml_in]},
        {"fun": "storevirt.prepare_incoming", "args": [incoming, moved]},
        {"fun": "storevirt.prepare_incoming", "args": [incoming, moved]},
        {"fun": "storevirt.prepare_incoming", "args": ["store-0040-vm", [lost]]},
        {"fun": "storevirt.prepare_incoming", "args": [incoming, [outside]]},
        {"fun": "storevirt.define_incoming", "args": [incoming, xml_in.replace(incoming, VM, 1)]},
        {"fun": "storevirt.define_incoming", "args": [incoming, xml_in]},
        {"fun": "storevirt.define_incoming", "args": [incoming, xml_in]},
        {"fun": "storevirt.move_state", "args": [incoming]},
        {"fun": "storevirt.domain_xml", "args": [incoming]},
        {"fun": "storevirt.release_moved", "args": [VM]},
        {"fun": "storevirt.forget_moved", "args": [VM]},
        {"fun": "storevirt.shutdown", "args": [VM, 10]},
    ]
    (_overlay, _data, state, here, undefined_disks, prepared, again, no_backing, elsewhere,
     wrong_name, defined, defined_again, incoming_state, xml, unrecorded, unforgotten,
     _shut) = run_on_host_python(tmp_path, calls, define=(domain_with_data_disk(system, data),),
                                 start=[VM])
    assert ok(state)["defined"] and ok(state)["running"] and ok(state)["record"] is None
    assert [(d["path"], d["format"], d["virtual_size"], d["backing"]) for d in ok(state)["disks"]] \
        == [(str(system), "qcow2", 16 << 20, str(base)), (str(data), "raw", 1 << 30, None)]
    assert not here["ok"] and "defined on this host already" in here["error"]
    assert not undefined_disks["ok"] and "not on this host" in undefined_disks["error"]
    assert ok(prepared) == {"created": [m["path"] for m in moved]}
    assert ok(again) == {"created": []}  # idempotent
    assert Path(moved[1]["path"]).stat().st_size == 1 << 30
    assert Path(moved[1]["path"]).stat().st_blocks == 0  # sparse
    assert not no_backing["ok"] and str(tmp_path / "gone.qcow2") in no_backing["error"]
    assert not elsewhere["ok"] and "not in the VM's dir" in elsewhere["error"]
    assert not (tmp_path / "elsewhere.raw").exists()
    assert not wrong_name["ok"] and "nothing defined" in wrong_name["error"]
    assert ok(defined)["autostart"] and not ok(defined)["active"]
    assert ok(defined_again)["uuid"] == ok(defined)["uuid"] == INCOMING_UUID
    assert ok(incoming_state)["defined"] and not ok(incoming_state)["running"]
    assert f"<name>{incoming}</name>" in ok(xml)
    for refused in (unrecorded, unforgotten):
        assert not refused["ok"] and "the move record" in refused["error"], refused
    # the record says the copy finished: the old box lets the domain go, then its files
    (images / VM / MOVE_RECORD_FILE).write_text(json.dumps({"to": NEW_HV, "phase": "copied"}))
    running, _stopped, released, state_after, forgotten, gone = run_on_host_python(tmp_path, [
        {"fun": "storevirt.release_moved", "args": [VM]},
        {"fun": "storevirt.stop", "args": [VM]},
        {"fun": "storevirt.release_moved", "args": [VM]},
        {"fun": "storevirt.move_state", "args": [VM]},
        {"fun": "storevirt.forget_moved", "args": [VM]},
        {"fun": "storevirt.forget_moved", "args": [VM]},
    ], define=(domain_with_data_disk(system, data),), start=[VM])
    assert not running["ok"] and "running" in running["error"]  # never a running VM
    assert ok(released)["phase"] == "moved"
    assert ok(state_after)["record"]["phase"] == "moved" and not ok(state_after)["defined"]
    assert ok(forgotten) == {"undefined": False, "removed": True}
    assert not (images / VM).exists() and base.exists()
    assert ok(gone) == {"undefined": False, "removed": False}
    # a live move whose record still says "migrating" (the minion restarted as it ended):
    # libvirt undefined the domain here, so its files go; with the domain here, they stay
    (images / VM).mkdir()
    Path(system).write_bytes(b"left behind")
    (images / VM / MOVE_RECORD_FILE).write_text(json.dumps({"to": NEW_HV, "mode": "live",
                                                            "phase": "migrating"}))
    (left,) = run_on_host_python(tmp_path, [{"fun": "storevirt.forget_moved", "args": [VM]}])
    assert ok(left) == {"undefined": False, "removed": True} and not (images / VM).exists()
    (images / VM).mkdir()
    (images / VM / MOVE_RECORD_FILE).write_text(json.dumps({"to": NEW_HV, "mode": "live",
                                                            "phase": "migrating"}))
    (kept,) = run_on_host_python(tmp_path, [{"fun": "storevirt.forget_moved", "args": [VM]}],
                                 define=(domain_with_data_disk(system, data),))
    assert not kept["ok"] and "the move record" in kept["error"], kept
    assert (images / VM / MOVE_RECORD_FILE).exists()


def test_the_target_uri_is_of_the_boxs_own_driver() -> None:
    # a Xen box's storage is reached through its Xen driver (a sles15-xen box runs no QEMU
    # driver: qemu+tls would find none there), a KVM box's through QEMU's
    from tests.helpers import load_salt_module

    move = load_salt_module("_utils", "store_vm_move")
    assert move.tls_uri("10.0.1.12", "/etc/pki", False, "xen:///system") == \
        "xen+tls://10.0.1.12/system"
    assert move.tls_uri("10.0.1.12", "/etc/pki", True, "qemu:///system") == \
        "qemu+tls://10.0.1.12/system"
    assert move.tls_uri("fe80::1", "/srv/pki", True, "qemu+unix:///system?socket=/s") == \
        "qemu+tls://[fe80::1]/system?pkipath=/srv/pki/libvirt/client"


def test_an_ipv6_certificate_is_trusted_for_its_address(tmp_path: Path) -> None:
    # openssl prints an IPv6 SAN uncompressed and in capitals; the same address is trusted,
    # another is not (else every IPv6 box would be issued anew, then refused its move)
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding

    ca_dir = tmp_path / "ca"
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, HV)]))
           .sign(key, hashes.SHA256()))

    cert = sign(ca_dir, csr.public_bytes(Encoding.PEM).decode(), HV, "fd00::7", 30)
    assert "BEGIN CERTIFICATE" in cert
    status = {"verified": True, "subject_cn": HV, "san": ["FD00:0:0:0:0:0:0:7"],
              "ca_sha256": ca_sha256(ca_dir), "not_after": "2099-01-01T00:00:00Z"}
    assert trusted(status, HV, "fd00::7", ca_dir)
    assert not trusted(status, HV, "fd00::8", ca_dir)
    assert not trusted({**status, "san": ["FD00::7", "10.0.0.1"]}, HV, "fd00::7", ca_dir)



def test_a_second_send_disks_while_one_runs_is_refused(tmp_path: Path) -> None:
    # a retry after a timed-out call must not copy beside the first (it could delete the
    # volume the first one writes)
    import fcntl

    vm_dir = tmp_path / "images" / VM
    vm_dir.mkdir(parents=True)
    with open(vm_dir / (MOVE_RECORD_FILE + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (second,) = run_on_host_python(tmp_path, [
            {"fun": "storevirt.send_disks", "args": [VM, "192.0.2.8", NEW_HV]}])
    assert not second["ok"] and "another send_disks of it runs" in second["error"], second
    (free,) = run_on_host_python(tmp_path, [
        {"fun": "storevirt.send_disks", "args": [VM, "192.0.2.8", NEW_HV]}])
    assert not free["ok"] and "another send_disks" not in free["error"], free  # no domain here
