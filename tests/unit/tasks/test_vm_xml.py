"""The store VM's domain XML per hypervisor type (`store-rollout vm-xml`): one code path,
checked against libvirt's schema (virt-xml-validate) and, for Xen, against the device rules of
libvirt's libxl driver and Xen's libxl, which the schema does not know.

Sources of LIBXL_RULES (read 2026-11): libvirt src/libxl/libxl_conf.c (libxlMakeDisk,
libxlMakeNic, libxlMakeDomBuildInfo), src/libxl/libxl_domain.c; Xen c447b7308b
tools/libs/light/libxl_device.c, libxl_disk.c, libxl_dm.c, libxl_nic.c.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, VENV_BIN
from store_rollout.inventory import parse_inventory
from tasks.vm_domain import DEVICE_MODELS, domain_xml

IMAGES = "/var/lib/store-rollout/images"
INVENTORY = {"stores": [{
    "store_id": "0042", "erp": {"site_code": "S42"},
    "vm": {"vcpus": 2, "memory_mib": 2048, "disk_gib": 20, "network": "br0"},
    "hypervisor": {"hostname": "hv-0042.example", "mac": "52:54:00:00:00:42",
                   "ip": "10.42.0.10", "netmask": "255.255.255.0", "gateway": "10.42.0.1"}}]}
STORE = parse_inventory(INVENTORY).get("0042")
SEED = f"{IMAGES}/store-0042-vm/seed.iso"


def xen_disk_index(vdev: str) -> int | None:
    """Xen's libxl__device_disk_dev_number (libxl_device.c): the disk index of a vdev name,
    None for a name libxl refuses ("Invalid or unsupported virtual disk identifier",
    libxl_disk.c libxl__device_from_disk)."""
    def letters(s: str) -> int:
        n = 0
        for ch in s:
            n = n * 26 + (ord(ch) - ord("a") + 1)
        return n - 1

    if m := re.fullmatch(r"xvd([a-z]+)(\d*)", vdev):
        return letters(m[1]) if letters(m[1]) < 2**20 else None
    if m := re.fullmatch(r"hd([a-z])(\d*)", vdev):
        return letters(m[1]) if letters(m[1]) <= 3 else None
    if m := re.fullmatch(r"sd([a-z])(\d*)", vdev):
        return letters(m[1]) if letters(m[1]) <= 15 else None
    if m := re.fullmatch(r"d(\d+)(p\d+)?", vdev):
        return int(m[1])
    return None


# a QEMU device name for the emulated NIC (libxl passes <model> verbatim to -device,
# libxl_dm.c), or netfront (PV only); `virtio` is no QEMU device
XEN_NIC_MODELS = {"rtl8139", "e1000", "netfront"}


def _disks(root: ET.Element) -> list[ET.Element]:
    return root.findall("./devices/disk")


def rule_disk_names(root: ET.Element) -> list[str]:
    """libxlMakeDisk copies <target dev> into libxl's vdev unchanged; Xen must know the name."""
    return [f"disk {d.find('target').get('dev')}: libxl refuses this vdev name"  # type: ignore[union-attr]
            for d in _disks(root)
            if xen_disk_index(d.find("target").get("dev", "")) is None]  # type: ignore[union-attr]


def rule_readonly_emulated(root: ET.Element) -> list[str]:
    """libxl_dm.c: a read-only non-CD-ROM disk at index 0-3 fails creation ("qemu-xen doesn't
    support read-only IDE disk drivers"); a CD-ROM must be among the first 5 disks to be
    emulated ("Emulated CDROM can be only one of the first 4 disks")."""
    problems = []
    for d in _disks(root):
        dev = d.find("target").get("dev", "")  # type: ignore[union-attr]
        index = xen_disk_index(dev)
        if index is None:
            continue
        if d.get("device") == "cdrom" and index > 4:
            problems.append(f"cdrom {dev}: index {index} > 4 is not emulated")
        if d.get("device") != "cdrom" and d.find("readonly") is not None and index <= 3 \
                and not dev.startswith("sd"):
            problems.append(f"disk {dev}: read-only emulated IDE disk")
    return problems


def rule_disk_driver(root: ET.Element) -> list[str]:
    """libxlMakeDisk maps driver qemu -> QDISK (qcow2 too), file/phy -> raw only; an HVM CD-ROM
    needs a Qdisk or Phy backend (libxl_disk.c), so never tap."""
    problems = []
    for d in _disks(root):
        driver = d.find("driver")
        name = driver.get("name") if driver is not None else None
        fmt = driver.get("type") if driver is not None else "raw"
        if name not in (None, "qemu", "file", "phy"):
            problems.append(f"disk driver {name}: not a Qdisk/Phy backend")
        if name in ("file", "phy") and fmt != "raw":
            problems.append(f"disk driver {name} with {fmt}: raw only")
    return problems


def rule_nic_model(root: ET.Element) -> list[str]:
    """libxlMakeNic copies the model string; for HVM it becomes QEMU's -device name."""
    problems = []
    for nic in root.findall("./devices/interface"):
        model = nic.find("model")
        if model is not None and model.get("type") not in XEN_NIC_MODELS:
            problems.append(f"NIC model {model.get('type')}: no such device for qemu-xen")
        if nic.get("type") not in ("bridge", "ethernet", "network"):
            problems.append(f"interface type {nic.get('type')}: unsupported by libxlMakeNic")
    return problems


def rule_no_sysinfo(root: ET.Element) -> list[str]:
    """libvirt's libxl driver never passes <sysinfo>/<smbios> to libxl: anything there is lost."""
    return ["<sysinfo> is dropped by libxl"] if root.find("sysinfo") is not None else []


def rule_serial(root: ET.Element) -> list[str]:
    """libxlMakeDomBuildInfo: serials become hvm.serial(_list) as 'pty'/'file:'/...; parallel
    ports are refused; an HVM console is serial 0."""
    problems = [f"serial type {s.get('type')}" for s in root.findall("./devices/serial")
                if s.get("type") not in ("pty", "file", "tcp", "udp", "unix", "null")]
    if root.find("./devices/parallel") is not None:
        problems.append("parallel devices are not supported by libxl")
    if not root.findall("./devices/serial"):
        problems.append("no serial console")
    return problems


LIBXL_RULES: list[Callable[[ET.Element], list[str]]] = [
    rule_disk_names, rule_readonly_emulated, rule_disk_driver, rule_nic_model,
    rule_no_sysinfo, rule_serial]


def libxl_problems(xml: str) -> list[str]:
    root = ET.fromstring(xml)
    return [problem for rule in LIBXL_RULES for problem in rule(root)]


def vm_xml_cli(hypervisor: str, inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "store-rollout"), "vm-xml", "0042", "--inventory",
                           str(inventory), "--hypervisor", hypervisor, *extra],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          check=False)


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import yaml

    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    path.write_text(yaml.safe_dump(INVENTORY))
    return path


@pytest.mark.parametrize("hypervisor", ["xen", "kvm"])
def test_vm_xml_validates_against_libvirts_schema(hypervisor: str, inventory: Path,
                                                 tmp_path: Path) -> None:
    proc = vm_xml_cli(hypervisor, inventory, "--images-dir", IMAGES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == domain_xml(STORE, hypervisor, IMAGES) + "\n"
    out = tmp_path / f"{hypervisor}.xml"
    out.write_text(proc.stdout)
    check = subprocess.run(["virt-xml-validate", str(out), "domain"], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    root = ET.fromstring(proc.stdout)
    assert root.get("type") == hypervisor and root.findtext("./os/type") == "hvm"
    # the identity travels on the seed CD-ROM, never in <sysinfo>
    cdroms = root.findall("./devices/disk[@device='cdrom']")
    assert [c.find("source").get("file") for c in cdroms] == [SEED]  # type: ignore[union-attr]
    assert root.find("sysinfo") is None and "oemStrings" not in proc.stdout
    system, data = root.findall("./devices/disk[@device='disk']")
    assert system.find("source").get("file") == f"{IMAGES}/store-0042-vm/system.qcow2"  # type: ignore[union-attr]
    # the data disk: raw, beside the system disk, kept across system disk switches
    assert data.find("source").get("file") == f"{IMAGES}/store-0042-vm/data.raw"  # type: ignore[union-attr]
    assert data.find("driver").get("type") == "raw"  # type: ignore[union-attr]
    assert root.find("./devices/graphics/listen").get("address") == "127.0.0.1"  # type: ignore[union-attr]


def test_xen_xml_follows_libxl_device_rules() -> None:
    xml = domain_xml(STORE, "xen", IMAGES)
    assert libxl_problems(xml) == []
    root = ET.fromstring(xml)
    targets = [(d.get("device"), d.find("target").attrib) for d in _disks(root)]  # type: ignore[union-attr]
    assert targets == [("disk", {"dev": "xvda", "bus": "xen"}),
                       ("disk", {"dev": "xvdb", "bus": "xen"}),
                       ("cdrom", {"dev": "xvdc", "bus": "xen"})]
    models = [m.get("type") for m in root.iterfind("./devices/interface/model")]
    assert models == ["e1000"] and "virtio" not in xml
    assert [s.get("type") for s in root.iterfind("./devices/serial")] == ["pty"]


def test_kvm_xml_uses_virtio() -> None:
    root = ET.fromstring(domain_xml(STORE, "kvm", IMAGES))
    targets = [(d.get("device"), d.find("target").attrib) for d in _disks(root)]  # type: ignore[union-attr]
    assert targets == [("disk", {"dev": "vda", "bus": "virtio"}),
                       ("disk", {"dev": "vdb", "bus": "virtio"}),
                       ("cdrom", {"dev": "sda", "bus": "sata"})]
    assert [m.get("type") for m in root.iterfind("./devices/interface/model")] == ["virtio"]


@pytest.mark.parametrize(("case", "change", "problem"), [
    ("virtio-disk", ("dev='xvda' bus='xen'", "dev='vda' bus='virtio'"), "disk vda"),
    ("virtio-nic", ("<model type='e1000'/>", "<model type='virtio'/>"), "NIC model virtio"),
    ("sysinfo", ("<devices>", "<sysinfo type='smbios'/><devices>"), "<sysinfo>"),
    ("tap-cdrom", ("<driver name='qemu' type='raw'", "<driver name='tap' type='raw'"),
     "disk driver tap"),
    ("far-cdrom", ("dev='xvdc'", "dev='xvdf'"), "cdrom xvdf"),
])
def test_libxl_rules_catch_what_xen_refuses(case: str, change: tuple[str, str],
                                            problem: str) -> None:
    """The rules can fail: the XML of the KVM era (vda, virtio NIC, SMBIOS identity) and other
    changes libxl refuses are caught."""
    xml = domain_xml(STORE, "xen", IMAGES)
    assert change[0] in xml, case
    problems = libxl_problems(xml.replace(change[0], change[1], 1))
    assert any(problem in p for p in problems), problems


def test_xen_disk_names_as_libxl_numbers_them() -> None:
    assert [xen_disk_index(v) for v in ("xvda", "xvdb", "xvdaa", "hdc", "hde", "sdp", "sdq",
                                        "d3p1", "vda")] == [0, 1, 26, 2, None, 15, None, 3, None]


def test_vm_xml_refuses_unknown_hypervisor_and_store(inventory: Path) -> None:
    proc = vm_xml_cli("vmware", inventory)
    assert proc.returncode == 2
    assert "--hypervisor 'vmware': choose one of" in proc.stderr
    assert sorted(DEVICE_MODELS) == ["kvm", "qemu", "xen"]
    proc = subprocess.run([str(VENV_BIN / "store-rollout"), "vm-xml", "9999", "--inventory",
                           str(inventory)], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120, check=False)
    assert proc.returncode == 2 and "9999" in proc.stderr
