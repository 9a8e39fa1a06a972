"""Racking a store host in the lab: a libvirt domain stands for the machine and a BMC emulator
(lab/bmc_service.py) drives its power, over IPMI (an endpoint of its own in vbmcd) or Redfish
(the emulator's system of the domain's name). What racking returns is what a technician writes
into the inventory for that host: protocol, address, port, Redfish system id.

In the default lab the domain is the machine's power and boot device only: no disk, and a PXE
NIC that is neither connected nor has a boot ROM, so its firmware finds nothing to boot and
idles; the simulator follows its lifecycle events (lab/simulator/) and plays the PXE install.
In the full lab the machine boots for real (lab/netboot.py): a NIC with QEMU's iPXE ROM on the
store network's bridge boots first, then a small disk the installer writes, and the serial
console goes to a file beside it. Either way the simulator runs the installed host's minion
while it is on. Each domain carries the store and MAC it stands for in its metadata (`HOST_NS`).
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import shutil
import socket
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.bmc_service import BMC_ADDRESS
from lab.netboot import HostFiles, host_files
from lab.state import LabInfo
from lab.store_network import BRIDGE
from store_rollout.contracts import SEED_METADATA_NS

HOST_NS = "https://store-rollout.invalid/lab/store-host"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
POWER_TYPES = ("ipmi", "redfish")


@dataclass(frozen=True)
class RackedHost:
    store_id: str
    system: str  # the domain's name: the host's Cobbler system and hypervisor minion id
    mac: str
    power_type: str
    power_address: str
    power_port: int | None = None
    redfish_system_id: str | None = None
    serial: str | None = None

    def inventory_fields(self) -> dict[str, Any]:
        """The host's BMC fields and serial number of an inventory entry (`hypervisor.*`)."""
        fields = {"power_type": self.power_type, "power_address": self.power_address,
                  "power_port": self.power_port, "redfish_system_id": self.redfish_system_id,
                  "serial": self.serial}
        return {k: v for k, v in fields.items() if v is not None}


def host_name(store_id: str) -> str:
    return f"store-{store_id}-hv"


def lab_serial(mac: str) -> str:
    """The serial number on a lab machine's label (and in its SMBIOS): one per box, from its
    MAC, so a new box (a replacement) has another."""
    return "LAB" + mac.lower().replace(":", "").upper()


def smbios_serial(dom_xml: str) -> str | None:
    """The SMBIOS system serial a domain's firmware hands its OS (`<sysinfo type='smbios'>`)."""
    entry = ET.fromstring(dom_xml).find("./sysinfo[@type='smbios']/system/entry[@name='serial']")
    return entry.text if entry is not None else None


def _host_domain(name: str, store_id: str, mac: str, *, memory_mib: int, boot: str,
                 devices: str, domain_type: str = "qemu", qemu_args: tuple[str, ...] = ()) -> str:
    """A store host's domain: its store and MAC in the metadata, the devices given."""
    args = "".join(f"\n    <qemu:arg value='{arg}'/>" for arg in qemu_args)
    commandline = f"\n  <qemu:commandline>{args}\n  </qemu:commandline>" if args else ""
    return f"""<domain type='{domain_type}' xmlns:qemu='{QEMU_NS}'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <metadata>
    <host:host xmlns:host='{HOST_NS}' store_id='{store_id}' mac='{mac}'/>
  </metadata>
  <sysinfo type='smbios'>
    <system>
      <entry name='manufacturer'>store-rollout lab</entry>
      <entry name='product'>store host</entry>
      <entry name='serial'>{lab_serial(mac)}</entry>
    </system>
  </sysinfo>
  <os><type arch='x86_64' machine='pc'>hvm</type>{boot}<smbios mode='sysinfo'/></os>
  <on_poweroff>destroy</on_poweroff>
  <devices>{devices}
    <memballoon model='none'/>
  </devices>{commandline}
</domain>"""


def host_xml(name: str, store_id: str, mac: str) -> str:
    return _host_domain(name, store_id, mac, memory_mib=32, boot="<boot dev='hd'/>", devices=f"""
    <!-- the PXE NIC with the store's MAC (a Redfish boot override needs a device to boot
         from); not connected and without a boot ROM: the PXE boot itself is simulated -->
    <interface type='ethernet'>
      <mac address='{mac}'/>
      <model type='e1000'/>
      <link state='down'/>
      <rom enabled='no'/>
    </interface>""")


def netbooting_host_xml(name: str, store_id: str, mac: str, files: HostFiles,
                        domain_type: str) -> str:
    """The full lab's machine: network first (PXELINUX hands back to the BIOS when Cobbler's
    netboot is off), then its disk. A BMC's boot override rewrites the <os> boot order to the
    network alone, for good (libvirt has no "once"), and libvirt makes QEMU's boot order
    strict; a server's firmware goes on to its other boot devices when the network boot hands
    back, so QEMU's boot order is made non-strict (`-boot strict=off`, given after libvirt's)."""
    return _host_domain(name, store_id, mac, memory_mib=256, domain_type=domain_type,
                        boot="<boot dev='network'/><boot dev='hd'/>",
                        qemu_args=("-boot", "strict=off"), devices=f"""
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{files.disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <mac address='{mac}'/>
      <source bridge='{BRIDGE}'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='{files.console}' append='on'/>
      <target port='0'/>
    </serial>""")


def host_of(dom_xml: str) -> dict[str, str] | None:
    """The store and MAC a lab store host's domain stands for; None for any other domain."""
    found = ET.fromstring(dom_xml).find(f"./metadata/{{{HOST_NS}}}host")
    return dict(found.attrib) if found is not None else None


def rack(info: LabInfo, store_id: str, mac: str, power_type: str,
         name: str | None = None, own_libvirt: bool = False) -> RackedHost:
    """The store's host, defined (off) with its BMC; racking it again changes nothing. `name`:
    the box's own name for a second box of the store (a replacement, a refresh's new box;
    default: the store's host name, which is also its Cobbler system and minion id);
    `own_libvirt`: the box runs a libvirtd of its own while its OS is up (lab/boxes.py: TLS on
    the box's address, its own images and PKI; `box_info` finds them), instead of driving the
    lab's shared one. Racking a box again with it adds it (from the box's next boot)."""
    import libvirt

    if power_type not in POWER_TYPES:
        raise ValueError(f"power_type {power_type!r}: use one of {', '.join(POWER_TYPES)}")
    name = name or host_name(store_id)
    if own_libvirt:
        if info.full:
            raise ValueError("own_libvirt: the full lab's store hosts drive the shared "
                             "libvirtd only; rack it in the default lab")
        from lab.boxes import mark

        mark(info.state_dir, name, store_id)
    conn = libvirt.open(info.libvirt_uri)
    try:
        # asked by listing: a failed lookup has libvirt print an error on stderr
        if name not in {dom.name() for dom in conn.listAllDomains()}:
            if info.full:
                files = host_files(info, name)
                files.create()
                conn.defineXML(netbooting_host_xml(name, store_id, mac.lower(), files,
                                                   info.vm_type))
            else:
                conn.defineXML(host_xml(name, store_id, mac.lower()))
        # the label of the box racked (a box racked before keeps its own)
        serial = smbios_serial(conn.lookupByName(name).XMLDesc(0))
    finally:
        conn.close()
    if power_type == "redfish":
        return RackedHost(store_id, name, mac, power_type, info.redfish_url,
                          redfish_system_id=name, serial=serial)
    port = vbmc_port(info, name)
    if port is None:
        port = _free_udp_port()
        _write_vbmc_config(info, name, port)
        _vbmcd(info, {"command": "start", "domain_names": [name]})
        _wait_answering(info, store_id, port)
    return RackedHost(store_id, name, mac, power_type, BMC_ADDRESS, power_port=port,
                      serial=serial)


@dataclass(frozen=True)
class BoxInfo:
    """A box racked with its own libvirtd, as a test reaches it: `uri` (its unix socket, from
    the lab's own namespace), `tls_uri` (its TLS listener at its address on the store network,
    from another box's namespace; None until its OS first ran), its images and PKI dirs,
    its minion id and whether its libvirtd runs."""

    name: str
    store_id: str
    dir: Path
    uri: str
    admin_uri: str
    images_dir: Path
    pki_dir: Path
    address: str | None
    minion_id: str | None
    running: bool
    netns_pid: int | None

    @property
    def tls_uri(self) -> str | None:
        return f"qemu+tls://{self.address}/system" if self.address else None


def box_info(info: LabInfo, name: str) -> BoxInfo | None:
    """The box `name` racked with `own_libvirt`, else None."""
    from lab import box_libvirt
    from lab.boxes import own_box

    box = own_box(info.state_dir, name, info.vm_images_dir)
    if box is None:
        return None
    processes = box.processes()
    running = box.running()
    holder = box.record("netns")
    return BoxInfo(name=name, store_id=box.store_id, dir=box.dir, uri=box.uri,
                   admin_uri=box_libvirt.admin_uri(box.dir), images_dir=box.images,
                   pki_dir=box.pki, address=processes.get("address"),
                   minion_id=processes.get("minion_id"), running=running,
                   netns_pid=holder.pid if running and holder is not None else None)


def store_domains(info: LabInfo, store_id: str, active: bool) -> list[Any]:
    """The store's VM domains (the lab's one libvirtd holds every host's): those seeded with
    its identity; `active`: the running ones only."""
    import libvirt

    flag = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE if active else 0
    conn = libvirt.open(info.libvirt_uri)
    mine = []
    for dom in conn.listAllDomains(flag):
        with contextlib.suppress(libvirt.libvirtError, ET.ParseError):
            seed = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).find(
                f"./metadata/{{{SEED_METADATA_NS}}}seed")
            if seed is not None and seed.get("store_id") == store_id:
                mine.append(dom)
    return mine


def remove_domain(info: LabInfo, dom: Any) -> tuple[str, int]:
    """A store VM gone with its host's disk: undefined, its disk files removed (the shared
    base images kept). Returns its name and how many files went."""
    import libvirt

    images = Path(info.vm_images_dir).resolve()
    xml = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    files = [Path(s.get("file", "")).resolve()
             for s in xml.iterfind("./devices/disk/source") if s.get("file")]
    with contextlib.suppress(libvirt.libvirtError):
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    for path in files:
        if path.is_relative_to(images) and "base" not in path.relative_to(images).parts:
            path.unlink(missing_ok=True)
    return dom.name(), len(files)


def unrack(info: LabInfo, store_id: str, name: str | None = None) -> None:
    """The host off and gone, with its IPMI endpoint (a cleanup, or a box destroyed: the store
    VMs on its disk go with it; nothing left is an error)."""
    import libvirt

    from lab.boxes import own_box, power_cut

    name = name or host_name(store_id)
    box = own_box(info.state_dir, name, info.vm_images_dir)
    if box is not None:  # its VMs are on its own libvirtd, their disks in its dir
        power_cut(box)
        shutil.rmtree(box.dir, ignore_errors=True)
    for dom in store_domains(info, store_id, active=False):
        remove_domain(info, dom)
    if vbmc_port(info, name) is not None:
        _vbmcd(info, {"command": "delete", "domain_names": [name]})
    conn = libvirt.open(info.libvirt_uri)
    try:
        for dom in conn.listAllDomains():
            if dom.name() == name:
                if dom.isActive():
                    with contextlib.suppress(libvirt.libvirtError):  # went off meanwhile
                        dom.destroy()
                dom.undefine()
    finally:
        conn.close()
    shutil.rmtree(host_files(info, name).disk.parent, ignore_errors=True)


def rack_inventory(info: LabInfo, path: Path, own_libvirt: bool = False) -> list[RackedHost]:
    """Rack every store of a YAML inventory and write each host's BMC fields into its entry, as
    a technician records them. A host's protocol: its entry's `power_type`, else by its place
    in the file: the 1st, 3rd... behind IPMI, the 2nd, 4th... behind Redfish (so any inventory
    of two stores or more drives both). `own_libvirt`: every host with a libvirtd of its
    own (`rack`)."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    racked = []
    for n, entry in enumerate(raw["stores"]):
        hv = entry["hypervisor"]
        host = rack(info, str(entry["store_id"]), hv["mac"],
                    hv.get("power_type") or POWER_TYPES[n % 2], own_libvirt=own_libvirt)
        hv.update(host.inventory_fields())
        racked.append(host)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return racked


def _wait_answering(info: LabInfo, store_id: str, port: int) -> None:
    """Racked means reachable: vbmcd answers `start` before the BMC's own process listens."""
    from pydantic import SecretStr

    from lab.procs import wait_until
    from tasks.bmc import BmcUnreachable, IpmiBmc

    bmc = IpmiBmc(BMC_ADDRESS, info.bmc_user, SecretStr(info.bmc_password), port=port,
                  timeout=2, store_id=store_id)

    def answers() -> bool:
        try:
            bmc.power_state()
            return True
        except BmcUnreachable:
            return False

    wait_until(answers, 30, f"the IPMI BMC of store {store_id} on port {port}", interval=0.2)


def _write_vbmc_config(info: LabInfo, name: str, port: int) -> None:
    """The BMC's record as `vbmc add` stores it (virtualbmc's manager), written here: vbmcd
    logs each control request with its arguments at debug level, a login included; `start`
    then carries only the domain's name."""
    config = configparser.ConfigParser()
    config["VirtualBMC"] = {"domain_name": name, "username": info.bmc_user,
                            "password": info.bmc_password, "port": str(port),
                            "address": BMC_ADDRESS, "libvirt_uri": info.libvirt_uri,
                            "active": "False"}
    path = Path(info.vbmc_dir) / name / "config"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        config.write(out)


def vbmc_port(info: LabInfo, name: str) -> int | None:
    """The IPMI port of a host racked behind IPMI, else None."""
    config = Path(info.vbmc_dir) / name / "config"
    if not config.exists():
        return None
    parser = configparser.ConfigParser()
    parser.read(config)
    return parser.getint("VirtualBMC", "port")


def _vbmcd(info: LabInfo, request: dict[str, Any]) -> None:
    answer = vbmcd_request(info.vbmcd_port, request)
    if answer.get("rc") != 0:
        raise RuntimeError(f"vbmcd {request['command']}: {answer.get('msg')}")


def vbmcd_request(port: int, request: dict[str, Any], timeout_ms: int = 15000) -> dict[str, Any]:
    """One request to vbmcd's control socket (what `vbmc add|start|delete|list` send)."""
    import zmq

    context = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(json.dumps(request).encode())
        if not sock.poll(timeout_ms):
            raise TimeoutError(f"vbmcd on port {port} did not answer {request['command']}")
        answer: dict[str, Any] = json.loads(sock.recv())
        return answer
    finally:
        sock.close()
        context.term()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((BMC_ADDRESS, 0))
        return int(sock.getsockname()[1])


def racked_hosts(info: LabInfo) -> list[dict[str, Any]]:
    """Every racked host with its power state (`lab status`)."""
    import libvirt

    conn = libvirt.openReadOnly(info.libvirt_uri)
    try:
        hosts = []
        for dom in conn.listAllDomains():
            host = host_of(dom.XMLDesc(0))
            if host is not None:
                port = vbmc_port(info, dom.name())
                hosts.append({**host, "system": dom.name(), "on": bool(dom.isActive()),
                              "ipmi_port": port})
        return hosts
    finally:
        conn.close()

