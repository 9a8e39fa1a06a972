"""Read-only views of a store VM's domain and disk on its hypervisor (storevirt.domain_summary,
inspect, create_overlay), a Salt utils module: __utils__["store_domain_inspect.*"] in execution
modules, synced from salt://_utils.

Python 3.6 and Salt 3006.0 (a Leap 15.6 store host) as well as Salt 3008.
"""

import json
import os
import subprocess

# capture_output= and text= are Python 3.7: a Leap 15.6 minion runs 3.6 (store-stack.md)
_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}


def lookup(conn, name):
    """Domain `name` on libvirt connection `conn`, or None when there is none."""
    import libvirt

    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError:
        return None


def qemu_img_info(disk):
    """qemu-img's JSON about `disk`; --force-share: a running VM holds its write lock."""
    return json.loads(subprocess.run(
        ["qemu-img", "info", "--force-share", "--output=json", disk],
        check=True, **_CAPTURE_TEXT).stdout)


def backing_file(info):
    """The backing file named in qemu_img_info's answer `info` (absolute when qemu-img says)."""
    return info.get("full-backing-filename", info.get("backing-filename"))


def summary(dom, name, root):
    """State, disk, backing file and graphics listen address of domain `dom` (`name`), whose
    XML is `root`."""
    # the system disk: the first disk that is not the data disk (store_vm_disks.DATA_DISK_FILE)
    disks = [source.get("file") for source in root.findall("./devices/disk[@device='disk']/source")]
    disk = next((path for path in disks if path and os.path.basename(path) != "data.raw"), None)
    backing = backing_file(qemu_img_info(disk)) if disk and os.path.exists(disk) else None
    graphics = root.find("./devices/graphics")
    return {
        "name": name, "uuid": dom.UUIDString(), "active": bool(dom.isActive()),
        "autostart": bool(dom.autostart()),
        "disk": disk, "backing": backing,
        "graphics": None if graphics is None else {
            "type": graphics.get("type"), "listen": graphics.get("listen")},
    }
