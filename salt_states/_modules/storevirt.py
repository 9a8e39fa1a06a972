"""Hypervisor-side helpers for the store VM, next to saltext-virt's `virt` module.

- the base image is cached once per hypervisor (image + meta.json, keyed by content hash);
- each VM disk is a qcow2 overlay on it (backing file), never a copy; the base is read-only;
- the VM's identity (minion id, one-time autosign token) is seeded as SMBIOS OEM strings,
  which the image's store-identity service reads at boot: no guestfs seeding (salt#56002).
"""

import json
import os
import subprocess
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError

__virtualname__ = "storevirt"
OEM_PREFIX = "store_rollout."


def __virtual__():
    return __virtualname__


def _images_dir():
    return __salt__["config.get"]("virt:images", "/srv/salt-images")


def _connect():
    import libvirt

    uri = __salt__["config.get"]("virt:connection:uri", None)
    return libvirt.open(uri)


def ensure_base_image(source, key, meta_source=None):
    """Cache the base image `source` (file://, http(s)://, salt://) as <images>/base/<key>/.

    CLI Example: salt hv storevirt.ensure_base_image http://images/abc/image.qcow2 abc
    """
    base_dir = os.path.join(_images_dir(), "base", key)
    dest = os.path.join(base_dir, "image.qcow2")
    if not os.path.exists(dest):
        os.makedirs(base_dir, exist_ok=True)
        tmp = dest + ".part"
        if source.startswith("file://") or source.startswith("/"):
            path = source[len("file://"):] if source.startswith("file://") else source
            subprocess.run(["cp", "--sparse=always", path, tmp], check=True)
        else:
            __salt__["cp.get_url"](source, tmp)
        if meta_source:
            meta_dest = os.path.join(base_dir, "meta.json")
            if meta_source.startswith("file://") or meta_source.startswith("/"):
                path = meta_source[7:] if meta_source.startswith("file://") else meta_source
                subprocess.run(["cp", path, meta_dest], check=True)
            else:
                __salt__["cp.get_url"](meta_source, meta_dest)
        os.chmod(tmp, 0o444)  # the base is never written: overlays only
        os.rename(tmp, dest)
    return dest


def create_overlay(name, base, size_mib=None):
    """qcow2 overlay for VM `name` on `base`; an existing overlay on the same base is kept."""
    vm_dir = os.path.join(_images_dir(), name)
    disk = os.path.join(vm_dir, "system.qcow2")
    if os.path.exists(disk):
        info = json.loads(subprocess.run(
            ["qemu-img", "info", "--force-share", "--output=json", disk],
            check=True, capture_output=True, text=True).stdout)
        if info.get("full-backing-filename", info.get("backing-filename")) != base:
            raise CommandExecutionError(
                f"{disk} exists on another base image ({info.get('backing-filename')}); "
                "remove the VM before recreating it")
        return {"path": disk, "created": False}
    os.makedirs(vm_dir, exist_ok=True)
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, disk]
    if size_mib:
        argv.append(f"{int(size_mib)}M")
    subprocess.run(argv, check=True, capture_output=True)
    return {"path": disk, "created": True}


def seed_identity(name, identity):
    """Put `identity` (dict) into the domain's SMBIOS OEM strings (persistent definition)."""
    conn = _connect()
    try:
        dom = conn.lookupByName(name)
        import libvirt

        root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        for old in root.findall("sysinfo"):
            root.remove(old)
        sysinfo = ET.SubElement(root, "sysinfo", {"type": "smbios"})
        oem = ET.SubElement(sysinfo, "oemStrings")
        for key in sorted(identity):
            ET.SubElement(oem, "entry").text = f"{OEM_PREFIX}{key}={identity[key]}"
        os_el = root.find("os")
        if os_el is not None and os_el.find("smbios") is None:
            ET.SubElement(os_el, "smbios", {"mode": "sysinfo"})
        conn.defineXML(ET.tostring(root, encoding="unicode"))
        return True
    finally:
        conn.close()


def domain_summary(name):
    """State, disk, backing file and graphics listen address of domain `name`, or None."""
    import libvirt

    conn = _connect()
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            return None
        root = ET.fromstring(dom.XMLDesc(0))
        source = root.find("./devices/disk[@device='disk']/source")
        disk = source.get("file") if source is not None else None
        backing = None
        if disk and os.path.exists(disk):
            info = json.loads(subprocess.run(
                ["qemu-img", "info", "--force-share", "--output=json", disk],
                check=True, capture_output=True, text=True).stdout)
            backing = info.get("full-backing-filename", info.get("backing-filename"))
        graphics = root.find("./devices/graphics")
        identity = {}
        for entry in root.iterfind("./sysinfo/oemStrings/entry"):
            key, _, value = (entry.text or "").partition("=")
            if key.startswith(OEM_PREFIX):
                identity[key[len(OEM_PREFIX):]] = "***" if "token" in key else value
        return {
            "name": name, "uuid": dom.UUIDString(), "active": bool(dom.isActive()),
            "disk": disk, "backing": backing,
            "graphics": None if graphics is None else {
                "type": graphics.get("type"), "listen": graphics.get("listen")},
            "identity": identity,
        }
    finally:
        conn.close()


def remove_vm(name):
    """Destroy and undefine domain `name` and delete its overlay dir; the base stays.

    CLI Example: salt hv storevirt.remove_vm store-0001-vm
    """
    import shutil

    import libvirt

    conn = _connect()
    removed = {"domain": False, "disk_dir": False}
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            dom = None
        if dom is not None:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
            removed["domain"] = True
    finally:
        conn.close()
    vm_dir = os.path.join(_images_dir(), name)
    if os.path.isdir(vm_dir) and os.path.basename(vm_dir) != "base":
        shutil.rmtree(vm_dir)
        removed["disk_dir"] = True
    return removed
