"""A store VM's move to the store's new box (storevirt's move_state, prepare_incoming,
migrate_live, send_disks, disks_sha256, define_incoming, release_moved, forget_moved), a Salt
utils module: __utils__["store_vm_move.*"] in execution modules, synced from salt://_utils.

- the move record <images>/<vm>/move.json on the old box (contracts.MOVE_RECORD_FILE), written
  (atomically, store_vm_disks.write_json) BEFORE anything moves: where the VM goes, how (live,
  offline), the phase, and on the offline path each disk's offset, so a rerun goes on;
- the target: the new box's libvirtd over TLS (`qemu+tls://<address>/system`), with this host's
  certificate from the master's CA; a disk goes into a dir storage pool over <images>/<vm> there
  with libvirt's storage volume upload, chunk by chunk, the holes and all-zero chunks of a sparse
  file skipped (the new volume reads zero there).

Python 3.6 and Salt 3006.0 (a SLES 15 SP7 store host) as well as Salt 3008.
"""

import json
import os
import subprocess

from salt.exceptions import CommandExecutionError

MOVE_RECORD_FILE = "move.json"  # contracts.MOVE_RECORD_FILE
DEFAULT_PKI_DIR = "/etc/pki"
CHUNK = 4 * 1024 * 1024  # bytes read, checked for zeros and uploaded at a time
SEND = 256 * 1024  # bytes per stream send (libvirt's RPC payload is bounded)
_ZERO = bytes(CHUNK)

_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}


def record_path(images_dir, name):
    return os.path.join(images_dir, name, MOVE_RECORD_FILE)


def tls_uri(address, pki_dir, for_minion, local_uri=None):
    """The target's libvirt URI, of this host's own driver (`local_uri`'s: xen:///system on a
    sles15-xen box, whose storage a Xen move uploads to; qemu by default); `for_minion`: a
    connection this process opens (not libvirtd, whose own /etc/pki is its pki dir), so a pki
    dir elsewhere is named as the pkipath."""
    host = "[{}]".format(address) if ":" in address else address
    driver = (local_uri or "qemu").split(":", 1)[0].split("+", 1)[0] or "qemu"
    uri = "{}+tls://{}/system".format(driver, host)
    if for_minion and os.path.normpath(pki_dir) != DEFAULT_PKI_DIR:
        uri += "?pkipath=" + os.path.join(pki_dir, "libvirt", "client")
    return uri


def disks_of(root):
    """The file paths of the domain's disks (device='disk'), in XML order."""
    paths = []
    for source in root.findall("./devices/disk[@device='disk']/source"):
        if source.get("file"):
            paths.append(source.get("file"))
    return paths


def disk_info(path):
    proc = subprocess.run(["qemu-img", "info", "--force-share", "--output=json", path],
                          check=False, **_CAPTURE_TEXT)
    if proc.returncode != 0:
        raise CommandExecutionError("move of {}: qemu-img info: {}".format(
            path, proc.stderr.strip()[-300:]))
    info = json.loads(proc.stdout)
    return {"path": path, "format": info.get("format"),
            "virtual_size": int(info.get("virtual-size") or 0),
            "backing": info.get("full-backing-filename", info.get("backing-filename")),
            "backing_format": info.get("backing-filename-format")}


def check_disk_path(images_dir, name, path, what):
    """Only the VM's own dir is written to: a path elsewhere is refused."""
    vm_dir = os.path.join(os.path.normpath(images_dir), name)
    if os.path.dirname(os.path.normpath(path)) != vm_dir:
        raise CommandExecutionError("{} {}: disk {} is not in the VM's dir {}; nothing "
                                    "written".format(what, name, path, vm_dir))


def precreate(disk):
    """`disk` (move_state's entry) made here: qcow2 on the same backing file, raw sparse of
    the same size; an existing file that matches is kept. Returns whether it was made."""
    path = disk["path"]
    if disk.get("format") == "qcow2" and disk.get("backing"):
        if not os.path.exists(disk["backing"]):
            raise CommandExecutionError(
                "prepare_incoming: the backing file {} of {} is not on this host; stage the "
                "base image first (storevirt.ensure_base_image)".format(disk["backing"], path))
    if os.path.exists(path):
        have = disk_info(path)
        if all(have[k] == disk.get(k) for k in ("format", "virtual_size", "backing")):
            return False
        os.remove(path)  # an earlier attempt's, for another disk: no domain here uses it
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if disk.get("format") == "qcow2":
        argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
        if disk.get("backing"):
            argv += ["-F", disk.get("backing_format") or "qcow2", "-b", disk["backing"]]
        argv += [path, str(int(disk["virtual_size"]))]
        proc = subprocess.run(argv, check=False, **_CAPTURE_TEXT)
        if proc.returncode != 0:
            raise CommandExecutionError("prepare_incoming: qemu-img create {}: {}".format(
                path, proc.stderr.strip()[-300:]))
    elif disk.get("format") == "raw":
        with open(path, "wb") as handle:
            handle.truncate(int(disk["virtual_size"]))
    else:
        raise CommandExecutionError("prepare_incoming: disk {} has format {!r}; a store VM's "
                                    "disks are qcow2 or raw".format(path, disk.get("format")))
    os.chmod(path, 0o600)
    return True


def file_sha256(path):
    import salt.utils.hashutils

    return salt.utils.hashutils.get_hash(path, "sha256")


def _data_extents(fd, start, size):
    """(begin, end) of the file's data from `start` on (SEEK_DATA/SEEK_HOLE; the whole rest
    where the filesystem cannot say)."""
    position = start
    while position < size:
        try:
            begin = os.lseek(fd, position, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            return
        end = os.lseek(fd, begin, os.SEEK_HOLE)
        yield begin, min(end, size)
        position = end


def storage_pool(target, vm_dir):
    """The target's storage pool over `vm_dir`: one it has, else a transient dir pool (made,
    with the dir, for this move)."""
    import libvirt

    try:
        pool = target.storagePoolLookupByTargetPath(vm_dir)
    except libvirt.libvirtError:
        xml = ("<pool type='dir'><name>store-move-{}</name><target><path>{}</path>"
               "</target></pool>").format(os.path.basename(vm_dir), vm_dir)
        pool = target.storagePoolCreateXML(xml, libvirt.VIR_STORAGE_POOL_CREATE_WITH_BUILD)
    if not pool.isActive():
        pool.create(0)
    pool.refresh(0)
    return pool


def fresh_volume(pool, path, size):
    """The target's volume for `path` made anew: raw, sparse, `size` bytes, 0600."""
    import libvirt

    filename = os.path.basename(path)
    try:
        pool.storageVolLookupByName(filename).delete(0)
    except libvirt.libvirtError:
        pass
    xml = ("<volume><name>{}</name><capacity unit='bytes'>{}</capacity><allocation>0"
           "</allocation><target><format type='raw'/><permissions><mode>0600</mode>"
           "</permissions></target></volume>").format(filename, int(size))
    return pool.createXML(xml, 0)


def _upload(target, vol, offset, data):
    stream = target.newStream(0)
    vol.upload(stream, offset, len(data), 0)
    sent = 0
    while sent < len(data):
        sent += stream.send(data[sent:sent + SEND])
    stream.finish()


def send_file(target, pool, path, entry, budget, save):
    """Upload `path` from `entry["offset"]` on (a fresh volume at offset 0), chunk by chunk,
    calling `save()` after each; at most `budget` bytes sent (None: no bound). Returns the
    bytes sent now; entry["offset"] == entry["size"] when the file is all there."""
    import libvirt

    size = entry["size"]
    if entry["offset"] == 0 or entry.get("volume") != os.path.basename(path):
        vol = fresh_volume(pool, path, size)
        entry.update(offset=0, volume=os.path.basename(path))
        save()
    else:
        try:
            vol = pool.storageVolLookupByName(os.path.basename(path))
        except libvirt.libvirtError:
            vol = fresh_volume(pool, path, size)
            entry["offset"] = 0
    sent = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for begin, end in list(_data_extents(fd, entry["offset"], size)):
            position = begin - begin % CHUNK  # chunk-aligned: a resume reads the same chunks
            while position < end:
                if budget is not None and sent >= budget:
                    return sent
                data = os.pread(fd, min(CHUNK, size - position), position)
                if data != _ZERO[:len(data)]:
                    _upload(target, vol, position, data)
                    sent += len(data)
                position += len(data)
                entry["offset"] = max(entry["offset"], position)
                save()
        entry["offset"] = size
        save()
    finally:
        os.close(fd)
    return sent


def migrate(dom, uri, flags, timeout, address=None):
    """migrateToURI3 of `dom` to `uri`, its job's stats read every half second meanwhile (the
    source's domain is gone once it ends) and the job aborted after `timeout` seconds.
    `address`: the target's, for QEMU's memory and disk streams (else the source resolves the
    target's own hostname, which may name no address the source reaches: boxes of one model
    can share a hostname, and a store needs no DNS for a migration either).
    Returns seconds, bytes (memory and disks) and the downtime libvirt reported (ms, or None)."""
    import threading
    import time

    import libvirt

    stats = {}
    done = threading.Event()
    deadline = time.monotonic() + timeout

    def watch():
        while not done.wait(0.25):
            try:
                info = dom.jobStats(0)
            except libvirt.libvirtError:  # the job ended meanwhile (or is not queryable yet)
                continue
            if info.get("type", libvirt.VIR_DOMAIN_JOB_NONE) != libvirt.VIR_DOMAIN_JOB_NONE:
                stats.update(info)
            if time.monotonic() > deadline:
                try:
                    dom.abortJob()
                except libvirt.libvirtError:
                    pass
                return

    started = time.monotonic()
    watcher = threading.Thread(target=watch, name="migrate-watch", daemon=True)
    watcher.start()
    try:
        params = {}
        if address:
            target = "tcp://[{}]".format(address) if ":" in address else "tcp://" + address
            params = {libvirt.VIR_MIGRATE_PARAM_URI: target,
                      libvirt.VIR_MIGRATE_PARAM_DISKS_URI: target}
        dom.migrateToURI3(uri, params, flags)
    except libvirt.libvirtError as exc:
        if time.monotonic() > deadline:
            raise CommandExecutionError("aborted after {:.0f} s (the bound given): {}".format(
                timeout, exc))
        raise
    finally:
        done.set()
        watcher.join()
    return {"seconds": round(time.monotonic() - started, 1), "bytes": moved_bytes(stats),
            "downtime_ms": stats.get("downtime")}


def moved_bytes(stats):
    return int(stats.get("memory_processed", 0)) + int(stats.get("disk_processed", 0))


def completed_stats(uri, name):
    """The destination's stats of the finished incoming migration (downtime, bytes), or {}."""
    import libvirt

    try:
        target = libvirt.open(uri)
    except libvirt.libvirtError:
        return {}
    try:
        return target.lookupByName(name).jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    except libvirt.libvirtError:
        return {}
    finally:
        target.close()
