"""The store VM's disks beside its system disk (storevirt.create_data_disk, stage_system_disk,
switch_system_disk, revert_system_disk, commit_update, prune_system_disks), a Salt utils module:
__utils__["store_vm_disks.*"] in execution modules, synced from salt://_utils.

- the data disk: <images>/<vm>/data.raw, a sparse raw file formatted ext4 (label STORE_DATA) by
  the host once; never reformatted, resized or overwritten; the guest mounts it at /srv/store
  and keeps the store's data and its own identity (minion id, keys) there;
- system disks: qcow2 overlays on a base image, <images>/<vm>/system.qcow2 (step 5's) and
  system-<basekey12>.qcow2 (an image update's, staged beside the current one);
- the update record <images>/<vm>/update.json: written (atomically) BEFORE a system disk
  switch, so a crashed orchestrator's rerun and reconcile read what was done from the host.

Python 3.6 and Salt 3006.0 (a Leap 15.6 store host) as well as Salt 3008.
"""

import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError

# the data disk contract, shared with the image (store_rollout/contracts.py; tests check both)
DATA_DISK_FILE = "data.raw"
DATA_DISK_LABEL = "STORE_DATA"
UPDATE_RECORD_FILE = "update.json"
SYSTEM_DISK = "system.qcow2"
SYSTEM_DISK_RE = re.compile(r"^system(-[A-Za-z0-9._-]+)?\.qcow2$")
BASE_IMAGE_FILE = "image.qcow2"

# capture_output= and text= are Python 3.7: a Leap 15.6 minion runs 3.6 (store-stack.md)
_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}


def vm_dir(images_dir, name):
    return os.path.join(images_dir, name)


def data_disk_path(images_dir, name):
    return os.path.join(images_dir, name, DATA_DISK_FILE)


def record_path(images_dir, name):
    return os.path.join(images_dir, name, UPDATE_RECORD_FILE)


def _run(argv, what):
    proc = subprocess.run(argv, check=False, **_CAPTURE_TEXT)
    if proc.returncode != 0:
        raise CommandExecutionError("{}: {} exited {}: {}".format(
            what, argv[0], proc.returncode, proc.stderr.strip()[-500:]))
    return proc.stdout


def create_data_disk(images_dir, name, size_gib):
    """VM `name`'s data disk: made (sparse, ext4 labelled STORE_DATA) only when there is none;
    an existing one is never reformatted, resized or overwritten."""
    path = data_disk_path(images_dir, name)
    if os.path.exists(path):
        return {"path": path, "created": False}
    size = int(size_gib)
    if size < 1:
        raise CommandExecutionError(
            "data disk of {}: size_gib {!r} must be a whole number of GiB >= 1 "
            "(inventory vm.data_disk_gib)".format(name, size_gib))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    part = path + ".part"  # the final name only ever holds a formatted disk
    with open(part, "wb") as handle:
        handle.truncate(size * 1024 ** 3)
    try:
        _run(["mkfs.ext4", "-q", "-F", "-L", DATA_DISK_LABEL, part], "data disk of " + name)
        os.chmod(part, 0o600)
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.remove(part)
    return {"path": path, "created": True}


def base_key(images_dir, backing):
    """The <key> of `backing` when it is a cached base image <images>/base/<key>/image.qcow2."""
    if not backing:
        return None
    parent, filename = os.path.split(os.path.normpath(backing))
    if filename != BASE_IMAGE_FILE:
        return None
    if os.path.dirname(parent) != os.path.normpath(os.path.join(images_dir, "base")):
        return None
    return os.path.basename(parent)


def base_version(base):
    """IMAGE_VERSION of base image `base`, from its meta.json's build params ("" unknown)."""
    try:
        with open(os.path.join(os.path.dirname(base), "meta.json")) as handle:
            meta = json.load(handle)
    except (OSError, ValueError, TypeError):
        return ""
    params = meta.get("params") if isinstance(meta, dict) else None
    return str((params or {}).get("IMAGE_VERSION") or "unversioned")


def system_disk_for(images_dir, name, base):
    """Where an update's system disk on `base` goes: system-<basekey12>.qcow2."""
    key = base_key(images_dir, base)
    if key is None:
        raise CommandExecutionError(
            "stage_system_disk {}: {} is not a cached base image (<images>/base/<key>/{}); "
            "stage it first (storevirt.ensure_base_image)".format(name, base, BASE_IMAGE_FILE))
    return os.path.join(images_dir, name, "system-{}.qcow2".format(key[:12]))


def virtual_size(disk):
    info = json.loads(_run(["qemu-img", "info", "--force-share", "--output=json", disk],
                           "qemu-img info " + disk))
    return int(info.get("virtual-size") or 0)


def stage_system_disk(images_dir, name, base, current):
    """A fresh qcow2 overlay on `base` beside `current` (the domain's system disk), as large
    as `current`; an existing file there (an earlier, maybe reverted, attempt) is made anew.
    Refuses to touch `current`."""
    path = system_disk_for(images_dir, name, base)
    if not os.path.exists(base):
        raise CommandExecutionError("stage_system_disk {}: base image {} is not on this host; "
                                    "stage it first (store-rollout stage-images)".format(name, base))
    if current and os.path.normpath(path) == os.path.normpath(current):
        raise CommandExecutionError(
            "stage_system_disk {}: {} is the domain's current system disk; it is never "
            "touched (the domain runs on {} already)".format(name, path, base))
    created = not os.path.exists(path)
    if not created:
        os.remove(path)
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, path]
    size = virtual_size(current) if current and os.path.exists(current) else 0
    if size > virtual_size(base):
        argv.append(str(size))
    _run(argv, "stage_system_disk " + name)
    return {"path": path, "created": created}


def disk_files(images_dir, name):
    """VM `name`'s data disk and system disks in its dir (sorted paths)."""
    path = vm_dir(images_dir, name)
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return [os.path.join(path, f) for f in names
            if f == DATA_DISK_FILE or SYSTEM_DISK_RE.match(f)]


def read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except OSError:
        return None


def write_json(path, record):
    """Atomic: a crash leaves the old record or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return record


def read_record(images_dir, name):
    return read_json(record_path(images_dir, name))


def write_record(images_dir, name, record):
    return write_json(record_path(images_dir, name), record)


def system_disk_element(root):
    """The domain's system disk (<disk device='disk'> that is not the data disk), or None."""
    for disk in root.findall("./devices/disk[@device='disk']"):
        source = disk.find("source")
        path = source.get("file") if source is not None else None
        if path and os.path.basename(path) == DATA_DISK_FILE:
            continue
        return disk
    return None


def data_disk_of(root):
    """The data disk's path in the domain XML `root`, or None."""
    for source in root.findall("./devices/disk[@device='disk']/source"):
        path = source.get("file")
        if path and os.path.basename(path) == DATA_DISK_FILE:
            return path
    return None


def system_disk_of(root):
    disk = system_disk_element(root)
    source = disk.find("source") if disk is not None else None
    return source.get("file") if source is not None else None


def set_system_disk(conn, dom, name, disk):
    """Redefine domain `dom` (persistent, inactive) with its system disk's source `disk`:
    same UUID, data disk, NIC and MAC."""
    import libvirt

    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE
                                     | libvirt.VIR_DOMAIN_XML_SECURE))
    element = system_disk_element(root)
    if element is None:
        raise CommandExecutionError("domain {} has no system disk to switch".format(name))
    for stale in element.findall("backingStore"):
        element.remove(stale)
    source = element.find("source")
    if source is None:
        source = ET.SubElement(element, "source")
    source.set("file", disk)
    conn.defineXML(ET.tostring(root, encoding="unicode"))


def inactive_domain(dom, name, what):
    if dom.isActive():
        raise CommandExecutionError(
            "{} {}: the domain is running; shut it down first (storevirt.shutdown)".format(
                what, name))


def switched_record(current, disk, version, run, from_version):
    return {"from": current, "to": disk, "from_version": from_version, "to_version": version,
            "run": run, "phase": "switched", "switched_at": time.time()}


def prunable(vm_path, current, record, now):
    """System overlays in `vm_path` that may go: not `current`, and the record's old disk once
    its keep time passed, or the record's new disk once its attempt was reverted."""
    if not record or not os.path.isdir(vm_path):
        return []
    doomed = set()
    if record.get("phase") == "committed" and now >= float(record.get("keep_until") or 0):
        doomed.add(record.get("from"))
    if record.get("phase") == "reverted":
        doomed.add(record.get("to"))
    found = []
    for filename in sorted(os.listdir(vm_path)):
        path = os.path.join(vm_path, filename)
        if SYSTEM_DISK_RE.match(filename) and path != current and path in doomed:
            found.append(path)
    return found


def remove_vm_files(images_dir, name, keep_data):
    """Delete VM `name`'s files: everything, or (`keep_data`) all but its data disk and update
    record. Returns (removed anything, the data disk kept or None)."""
    import shutil

    path = vm_dir(images_dir, name)
    if not os.path.isdir(path) or os.path.basename(path) == "base":
        return False, None
    if not keep_data:
        shutil.rmtree(path)
        return True, None
    kept = (DATA_DISK_FILE, UPDATE_RECORD_FILE)
    removed = False
    for filename in os.listdir(path):
        if filename in kept:
            continue
        target = os.path.join(path, filename)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
        removed = True
    data = data_disk_path(images_dir, name)
    if not os.listdir(path):
        os.rmdir(path)
    return removed, data if os.path.exists(data) else None
