"""The store's data disk (store_rollout/contracts.py DATA_DISK_*), on both sides of it:

- on the hypervisor: `export_data_disk` packs a stopped VM's data disk (<images>/<name>/data.raw,
  made by storevirt.create_data_disk) into a compressed, checksummed archive the orchestrator
  then has pushed to the master (cp.push) before a decommission removes the disk;
- on the store server: `mount_status` says whether the role's state directory is the data disk's
  mount (the store_vm formula's storedata.mounted state and the go-live gate's data disk check).

Runs under the store hosts' Python 3.6 (vermin). A minion with a private root_dir (a
simulated machine) has no mounts of its own: its root_dir stands for "/", and the data disk's
content is the directory there (its simulator puts it in place at the domain's start).
"""

import hashlib
import os
import subprocess
import time

from salt.exceptions import CommandExecutionError

__virtualname__ = "storedata"

DATA_DISK_FILE = "data.raw"  # store_rollout/contracts.py DATA_DISK_FILE
EXPORT_FILE = "data-export.tar.gz"
CHUNK = 1 << 20
TAR_TIMEOUT = 6 * 3600  # seconds packing one data disk may take


def __virtual__():
    return __virtualname__


def _images_dir():
    return __salt__["config.get"]("virt:images", "/srv/salt-images")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def export_data_disk(name, max_bytes=None):
    """Pack the data disk of VM `name` into <images>/<name>/data-export.tar.gz: a gzip'd tar
    of data.raw whose holes stay holes (GNU tar --sparse), its sha256 computed here. The
    domain must be stopped (a running store writes to it); an export left by an earlier try
    is made anew. `max_bytes`: the largest archive the master takes (its file_recv_max_size):
    a larger one is removed and refused before anything is sent.

    Returns {"exported": False, "data_disk": None} when the VM has no data disk, else
    {"exported": True, "path", "data_disk", "data_disk_bytes", "bytes", "sha256", "seconds"}.

    CLI Example: salt hv storedata.export_data_disk store-0001-vm max_bytes=1073741824
    """
    vm_dir = os.path.join(_images_dir(), name)
    disk = os.path.join(vm_dir, DATA_DISK_FILE)
    if not os.path.isfile(disk):
        return {"exported": False, "data_disk": None}
    summary = __salt__["storevirt.domain_summary"](name)
    if summary and summary.get("active"):
        raise CommandExecutionError(
            "domain {} runs: its data disk {} is exported only once the VM is shut down "
            "(storevirt.shutdown)".format(name, disk))
    started = time.monotonic()
    archive = os.path.join(vm_dir, EXPORT_FILE)
    part = archive + ".part"
    for stale in (archive, part):
        if os.path.exists(stale):
            os.remove(stale)
    proc = subprocess.run(["tar", "--sparse", "-czf", part, "-C", vm_dir, DATA_DISK_FILE],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=TAR_TIMEOUT, check=False)
    if proc.returncode != 0:
        if os.path.exists(part):
            os.remove(part)
        raise CommandExecutionError("packing {} failed: {}".format(
            disk, proc.stderr.decode("utf-8", "replace").strip()[-500:]))
    size = os.path.getsize(part)
    if max_bytes is not None and size > int(max_bytes):
        os.remove(part)
        raise CommandExecutionError(
            "the export of {} is {} bytes, more than the master takes ({} bytes, its "
            "file_recv_max_size): raise file_recv_max_size in the master's config".format(
                disk, size, int(max_bytes)))
    os.chmod(part, 0o600)
    os.rename(part, archive)
    return {"exported": True, "path": archive, "data_disk": disk,
            "data_disk_bytes": os.path.getsize(disk), "bytes": size,
            "sha256": _sha256(archive), "seconds": round(time.monotonic() - started, 3)}


def _own_machine():
    return os.path.realpath(__opts__.get("root_dir", "/")) == "/"


def _unescape(field):
    """A /proc/self/mounts field: space, tab, newline and backslash come octal-escaped."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _mounted_from(path, mounts="/proc/self/mounts"):
    """The device the newest mount at `path` is from, else None."""
    found = None
    with open(mounts) as handle:
        for line in handle:
            fields = line.split()
            if len(fields) >= 2 and _unescape(fields[1]) == path:
                found = _unescape(fields[0])
    return found


def mount_status(path, label):
    """Whether `path` (absolute, as on the store server) is the data disk's mount: on the
    machine's own minion, a mount of the disk labelled `label`; on a minion with a private
    root_dir (a simulated machine), the directory under that root.

    Returns {"path", "ok", "found", "observed"}: `found` is one of "mounted" (ok),
    "directory" (a private root's: ok when there), "unmounted" (the disk is there, not
    mounted), "no disk" and "other" (another filesystem is mounted there); `observed` says it
    in words.

    CLI Example: salt 'store-0001-vm' storedata.mount_status /srv/store STORE_DATA
    """
    if not _own_machine():
        real = __salt__["provisioning.root_path"](path.lstrip("/"))
        there = os.path.isdir(real)
        return {"path": real, "ok": there, "found": "directory",
                "observed": "the simulated machine's {} ({})".format(
                    path, "present" if there else "missing")}
    wanted = os.path.join("/dev/disk/by-label", label)
    device = _mounted_from(path)
    if device is None:
        if os.path.exists(wanted):
            return {"path": path, "ok": False, "found": "unmounted",
                    "observed": "not mounted (the disk labelled {} is there)".format(label)}
        return {"path": path, "ok": False, "found": "no disk",
                "observed": "not mounted; no disk labelled {}".format(label)}
    if os.path.exists(wanted) and os.path.realpath(device) == os.path.realpath(wanted):
        return {"path": path, "ok": True, "found": "mounted",
                "observed": "mounted from {} ({})".format(device, label)}
    return {"path": path, "ok": False, "found": "other",
            "observed": "mounted from {}, not the disk labelled {}".format(device, label)}


def mount(path, label, fstype="ext4"):
    """Mount the disk labelled `label` at `path` on the machine's own minion (a minion with a
    private root_dir refuses: it cannot mount on the host it runs on).

    CLI Example: salt 'store-0001-vm' storedata.mount /srv/store STORE_DATA
    """
    if not _own_machine():
        raise CommandExecutionError(
            "refusing to mount {}: this minion is not the machine's own (private "
            "root_dir)".format(path))
    done = __salt__["mount.mount"](path, "LABEL={}".format(label), mkmnt=True, fstype=fstype)
    if done is not True:
        raise CommandExecutionError("mounting LABEL={} at {} failed: {}".format(
            label, path, done))
    return mount_status(path, label)
