"""Hypervisor-side functions for the store VM, next to saltext-virt's `virt` module: what the
pipeline and the states call. Each opens the host's libvirt connection or reads the minion's
config, and leaves the work to the Salt utils modules in salt_states/_utils (`__utils__`,
synced with `_modules`: a highstate's sync_all, step 4's sync_utils before sync_modules):

- store_image_download: the base image, cached once per hypervisor (image + meta.json, keyed by
  content hash), verified, resumable, paced;
- store_seed_iso: the VM's identity on a read-only seed CD-ROM (ISO 9660, label STORE_SEED),
  attached before its first boot and ejected after firstboot;
- store_domain_inspect: read-only views of a domain and its disk;
- store_vm_disks: the data disk, an image update's system disk and its record (update.json).

Each VM's system disk is a qcow2 overlay on the base image (backing file), never a copy; the
base is read-only. Beside it the VM has a data disk (data.raw, ext4 STORE_DATA) that nothing
but a decommission (remove_vm keep_data=False) deletes.
"""

import functools
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError

__virtualname__ = "storevirt"

SYNCED_EXTENSION_PATTERN = r"\.(pyx?|so|zip)$"  # what saltutil.sync_* copies (salt.utils.extmods)


def __virtual__():
    return __virtualname__


def _images_dir():
    return __salt__["config.get"]("virt:images", "/srv/salt-images")


def _local_uri():
    return __salt__["config.get"]("virt:connection:uri", None)


def _connect():
    import libvirt

    return libvirt.open(_local_uri())


def ensure_base_image(source, key, sha256, meta=None, ca_pem=None, rate_limit=None,
                      timeout=60, delta=None):
    """Cache the base image `source` (an http(s):// URL) as <images>/base/<key>/image.qcow2.

    - verified: its sha256 must be `sha256` before it gets its final name; a mismatch removes
      the download and fails naming the image, both digests and the URL;
    - resumable: a cut download stays as image.qcow2.part and the next call asks for the rest
      (HTTP Range) instead of starting again;
    - atomic: the final name only ever holds a verified image;
    - TLS verified against the system trust store or `ca_pem` (PEM text), never skipped;
    - paced to `rate_limit` bytes/s when given, so a wave does not fill the store links;
    - `delta` ({source, sha256, old_key, content_sha256}): when this host holds base image
      `old_key`, only the delta is fetched and the image rebuilt and verified from it; any
      refusal falls back to the full download.

    Returns what it did: path, bytes transferred now, the offset it resumed from, seconds.

    CLI Example: salt hv storevirt.ensure_base_image https://images/abc/image.qcow2 abc <sha256>
    """
    return __utils__["store_image_download.ensure_base_image"](
        _images_dir(), source, key, sha256, meta=meta, ca_pem=ca_pem, rate_limit=rate_limit,
        timeout=timeout, delta=delta, rebuild=__utils__["store_image_delta.rebuild"])


def create_overlay(name, base, size_mib=None):
    """qcow2 overlay for VM `name` on `base`; an existing overlay on the same base is kept."""
    vm_dir = os.path.join(_images_dir(), name)
    disk = os.path.join(vm_dir, "system.qcow2")
    if os.path.exists(disk):
        info = __utils__["store_domain_inspect.qemu_img_info"](disk)
        if __utils__["store_domain_inspect.backing_file"](info) != base:
            raise CommandExecutionError(
                f"{disk} exists on another base image ({info.get('backing-filename')}); "
                "remove the VM before recreating it")
        return {"path": disk, "created": False}
    os.makedirs(vm_dir, exist_ok=True)
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, disk]
    if size_mib:
        argv.append(f"{int(size_mib)}M")
    subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return {"path": disk, "created": True}


def seed_path(name):
    """Where VM `name`'s identity seed ISO lives on this hypervisor (next to its disk)."""
    return __utils__["store_seed_iso.seed_path"](_images_dir(), name)


def seed_identity(name, identity):
    """Write VM `name`'s seed ISO and point its seed CD-ROM at it (persistent definition).

    The domain must be defined with that CD-ROM (store-rollout's virt.init arguments do) and
    must not run: the guest reads the seed at boot.

    CLI Example: salt hv storevirt.seed_identity store-0001-vm '{minion_id: store-0001-vm}'
    """
    conn = _connect()
    try:
        return __utils__["store_seed_iso.attach"](
            conn.lookupByName(name), name, seed_path(name), identity)
    finally:
        conn.close()


def _domain(conn, name):
    """Domain `name`, looked up by name alone: Salt's virt functions (start, stop,
    set_autostart, vm_state) first look up every domain of the host by id, and fail with "no
    domain with matching id N" when another domain stops in between."""
    dom = __utils__["store_domain_inspect.lookup"](conn, name)
    if dom is None:
        raise CommandExecutionError(f'The VM "{name}" is not present')
    return dom


def set_autostart(name):
    """Mark domain `name` to start when the host's libvirt starts (after a power cut).

    CLI Example: salt hv storevirt.set_autostart store-0001-vm
    """
    conn = _connect()
    try:
        _domain(conn, name).setAutostart(1)
    finally:
        conn.close()
    return True


def _stop_then(name, start):
    conn = _connect()
    try:
        dom = _domain(conn, name)
        if dom.isActive():
            dom.destroy()
        if start:
            dom.create()
    finally:
        conn.close()
    return True


def stop(name):
    """Hard stop of domain `name` (virt.stop's destroy, by name); a stopped one stays so.

    CLI Example: salt hv storevirt.stop store-0001-vm
    """
    return _stop_then(name, start=False)


def reset(name):
    """Hard reset of domain `name` (a hung guest): stopped if running, then started.

    CLI Example: salt hv storevirt.reset store-0001-vm
    """
    return _stop_then(name, start=True)


def retire_seed(name):
    """Eject VM `name`'s seed CD-ROM (running and persistent definition) and delete the ISO,
    so its one-time token does not outlive firstboot. Idempotent.

    CLI Example: salt hv storevirt.retire_seed store-0001-vm
    """
    path = seed_path(name)
    conn = _connect()
    try:
        __utils__["store_seed_iso.eject"](conn.lookupByName(name), path)
    finally:
        conn.close()
    removed = os.path.exists(path)
    if removed:
        os.remove(path)
    return {"seed": path, "state": "retired", "deleted": removed}


def domain_summary(name):
    """State, system disk, backing file and graphics listen address of domain `name`, or None;
    with whose identity was seeded and whether the seed is still attached (no token), its data
    disk (path or None) and the key of the base image its system disk is backed by (or None)."""
    conn = _connect()
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        if dom is None:
            return None
        root = ET.fromstring(dom.XMLDesc(0))
        summary = __utils__["store_domain_inspect.summary"](dom, name, root)
        summary["seed"] = __utils__["store_seed_iso.seed_state"](root, seed_path(name))
        summary["data_disk"] = __utils__["store_vm_disks.data_disk_of"](root)
        summary["image_key"] = __utils__["store_vm_disks.base_key"](_images_dir(),
                                                                     summary["backing"])
        return summary
    finally:
        conn.close()


def create_data_disk(name, size_gib):
    """VM `name`'s data disk <images>/<name>/data.raw: a sparse raw file formatted ext4
    (label STORE_DATA) by this host, made only when there is none. An existing data disk is
    never reformatted, resized or overwritten ("created": false).

    CLI Example: salt hv storevirt.create_data_disk store-0001-vm 8
    """
    return __utils__["store_vm_disks.create_data_disk"](_images_dir(), name, size_gib)


def _current_disk(conn, name):
    import libvirt

    dom = _domain(conn, name)
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    return dom, __utils__["store_vm_disks.system_disk_of"](root)


def stage_system_disk(name, base):
    """A fresh qcow2 overlay on base image `base` (<images>/base/<key>/image.qcow2) beside
    domain `name`'s current system disk: <images>/<name>/system-<key12>.qcow2. An existing file
    there that is not the current disk is made anew (it may have booted a reverted attempt);
    the current disk is never touched.

    CLI Example: salt hv storevirt.stage_system_disk store-0001-vm /srv/salt-images/base/k/image.qcow2
    """
    conn = _connect()
    try:
        _dom, current = _current_disk(conn, name)
    finally:
        conn.close()
    return __utils__["store_vm_disks.stage_system_disk"](_images_dir(), name, base, current)


def shutdown(name, timeout=120):
    """ACPI shutdown of domain `name`, waiting until it is off; after `timeout` seconds a hard
    stop ("clean": false). A domain that is off stays so.

    CLI Example: salt hv storevirt.shutdown store-0001-vm 120
    """
    import libvirt

    started = time.monotonic()
    conn = _connect()
    try:
        dom = _domain(conn, name)
        if not dom.isActive():
            return {"was_running": False, "clean": True, "seconds": 0.0}
        try:
            dom.shutdown()
        except libvirt.libvirtError:
            if dom.isActive():
                raise
        deadline = started + float(timeout)
        while dom.isActive() and time.monotonic() < deadline:
            time.sleep(0.5)
        clean = not dom.isActive()
        if not clean:
            try:
                dom.destroy()
            except libvirt.libvirtError:
                if dom.isActive():
                    raise
                clean = True  # its OS powered it off as the cut came
    finally:
        conn.close()
    return {"was_running": True, "clean": clean,
            "seconds": round(time.monotonic() - started, 1)}


def switch_system_disk(name, disk, version="", run=""):
    """Point inactive domain `name`'s system disk at `disk` (stage_system_disk's): FIRST the
    record <images>/<name>/update.json (from, to, versions, run, phase "switched"), THEN the
    persistent definition (same UUID, data disk, NIC and MAC). Idempotent when the domain
    already uses `disk` and the record says so.

    CLI Example: salt hv storevirt.switch_system_disk store-0001-vm <disk> version=v2 run=<id>
    """
    images_dir = _images_dir()
    conn = _connect()
    try:
        dom, current = _current_disk(conn, name)
        record = __utils__["store_vm_disks.read_record"](images_dir, name)
        if current == disk:
            if record and record.get("to") == disk and record.get("phase") == "switched":
                return domain_summary(name)
            raise CommandExecutionError(
                "switch_system_disk {}: the domain already uses {} and its update record "
                "does not say it was switched there; nothing to switch".format(name, disk))
        __utils__["store_vm_disks.inactive_domain"](dom, name, "switch_system_disk")
        if not os.path.exists(disk):
            raise CommandExecutionError("switch_system_disk {}: {} does not exist; stage it "
                                        "first (storevirt.stage_system_disk)".format(name, disk))
        from_version = ""
        if record and record.get("to") == current and record.get("phase") != "reverted":
            from_version = record.get("to_version") or ""
        if not from_version and current:
            from_version = __utils__["store_vm_disks.base_version"](
                __utils__["store_domain_inspect.backing_file"](
                    __utils__["store_domain_inspect.qemu_img_info"](current)) or "")
        __utils__["store_vm_disks.write_record"](images_dir, name, __utils__[
            "store_vm_disks.switched_record"](current, disk, version, run, from_version))
        __utils__["store_vm_disks.set_system_disk"](conn, dom, name, disk)
    finally:
        conn.close()
    return domain_summary(name)


def _record_or_fail(name, what):
    record = __utils__["store_vm_disks.read_record"](_images_dir(), name)
    if record is None:
        raise CommandExecutionError("{} {}: no update record ({}); the VM's system disk was "
                                    "never switched".format(what, name, "update.json"))
    return record


def revert_system_disk(name):
    """Point inactive domain `name`'s system disk back at its update record's "from" disk;
    the record's phase becomes "reverted". Idempotent.

    CLI Example: salt hv storevirt.revert_system_disk store-0001-vm
    """
    record = _record_or_fail(name, "revert_system_disk")
    conn = _connect()
    try:
        dom, current = _current_disk(conn, name)
        if current != record["from"]:
            __utils__["store_vm_disks.inactive_domain"](dom, name, "revert_system_disk")
            if not os.path.exists(record["from"]):
                raise CommandExecutionError(
                    "revert_system_disk {}: the previous system disk {} is gone (pruned); "
                    "there is nothing to revert to".format(name, record["from"]))
            __utils__["store_vm_disks.set_system_disk"](conn, dom, name, record["from"])
    finally:
        conn.close()
    if record.get("phase") != "reverted":
        record.update(phase="reverted", reverted_at=time.time())
        __utils__["store_vm_disks.write_record"](_images_dir(), name, record)
    return domain_summary(name)


def commit_update(name, keep_hours):
    """Domain `name`'s switch made good: its record's phase "committed", the previous system
    disk kept until `keep_hours` from now (for a manual revert). Idempotent.

    CLI Example: salt hv storevirt.commit_update store-0001-vm 168
    """
    record = _record_or_fail(name, "commit_update")
    if record.get("phase") == "committed":
        return record
    if record.get("phase") != "switched":
        raise CommandExecutionError("commit_update {}: the update record's phase is {!r}, not "
                                    "'switched'; only a switched update can be committed".format(
                                        name, record.get("phase")))
    now = time.time()
    record.update(phase="committed", committed_at=now,
                  keep_until=now + float(keep_hours) * 3600)
    return __utils__["store_vm_disks.write_record"](_images_dir(), name, record)


def update_record(name):
    """Domain `name`'s update record (update.json) or None.

    CLI Example: salt hv storevirt.update_record store-0001-vm
    """
    return __utils__["store_vm_disks.read_record"](_images_dir(), name)


def prune_system_disks(name):
    """Delete domain `name`'s system overlays that are not its current disk and whose keep
    time passed (or whose attempt was reverted); returns the deleted paths.

    CLI Example: salt hv storevirt.prune_system_disks store-0001-vm
    """
    images_dir = _images_dir()
    conn = _connect()
    try:
        if __utils__["store_domain_inspect.lookup"](conn, name) is None:
            return []
        _dom, current = _current_disk(conn, name)
    finally:
        conn.close()
    doomed = __utils__["store_vm_disks.prunable"](
        __utils__["store_vm_disks.vm_dir"](images_dir, name), current,
        __utils__["store_vm_disks.read_record"](images_dir, name), time.time())
    for path in doomed:
        os.remove(path)
    return doomed


def extension_hashes(forms, hash_type="sha256"):
    """{"<form>/<path>": digest} of the custom modules this minion runs with, as
    saltutil.sync_<form> left them in its extension_modules dir: step 4 syncs only when the
    master's differ (two jobs a rerun otherwise).

    CLI Example: salt hv storevirt.extension_hashes '[utils, modules]' sha256
    """
    import salt.utils.hashutils

    found = {}
    for form in forms:
        top = os.path.join(__opts__["extension_modules"], form)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [name for name in dirnames if name != "__pycache__"]
            for filename in filenames:
                if re.search(SYNCED_EXTENSION_PATTERN, filename):
                    path = os.path.join(dirpath, filename)
                    relpath = os.path.relpath(path, top).replace(os.sep, "/")
                    found[form + "/" + relpath] = salt.utils.hashutils.get_hash(path, hash_type)
    return found


def inspect(wanted=None, base_images=None):
    """Read-only. With `wanted`, {minion id: {"domains": [names], "base_images": [keys]}}:
    this host's part of it, as {"domains": {name: domain_summary or None}, "base_images": {key:
    cached}}; each minion picks its own entry. With `base_images` alone (a region's read): every
    domain defined on this host and which of those keys are cached, marked "every_domain": the
    publication then carries no store's names and stays small at any region's size (a map of
    1,000 stores sent to each of 2,000 minions was about 280 MB per read).

    CLI Example: salt -L hv1,hv2 storevirt.inspect '{hv1: {domains: [store-0001-vm]}}'
    CLI Example: salt -L hv1,hv2 storevirt.inspect base_images='[k0123]'
    """
    base_image_path = __utils__["store_image_download.base_image_path"]
    images_dir = _images_dir()
    if wanted is None:
        conn = _connect()
        try:
            names = sorted(dom.name() for dom in conn.listAllDomains())
        finally:
            conn.close()
        mine = {"domains": names, "base_images": list(base_images or [])}
    else:
        mine = wanted.get(__opts__["id"]) or {}
    found = {
        "domains": {name: domain_summary(name) for name in mine.get("domains", [])},
        "base_images": {key: os.path.exists(base_image_path(images_dir, key))
                        for key in mine.get("base_images", [])},
    }
    if wanted is None:
        found["every_domain"] = True
    return found


def remove_vm(name, keep_data=True):
    """Destroy and undefine domain `name` and delete its system disks and seed; the base
    stays, and so do its data disk and update record unless `keep_data` is False (only a
    decommission, after its export).

    CLI Example: salt hv storevirt.remove_vm store-0001-vm keep_data=False
    """
    conn = _connect()
    removed = {"domain": False, "disk_dir": False, "data_kept": None}
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        if dom is not None:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
            removed["domain"] = True
    finally:
        conn.close()
    removed["disk_dir"], removed["data_kept"] = __utils__["store_vm_disks.remove_vm_files"](
        _images_dir(), name, keep_data)
    return removed


# -- libvirt TLS between the store's boxes (issue 48): the master's CA signs each box's key ----

# the remote daemon of the platforms' modular libvirt (the hypervisor formula enables
# virtproxyd-tls.socket): it rereads its certificate files without a restart
TLS_RELOAD = ["virt-admin", "-c", "virtproxyd:///system", "server-update-tls", "virtproxyd"]


def _pki_dir():
    return __salt__["config.get"]("storevirt:pki_dir", "/etc/pki")


def tls_request():
    """A CSR for this host's libvirt key (made once here with `openssl`, 0600, it never leaves
    the host), subject O=store-rollout, CN=<minion id>, and the host's address toward the
    master (the source address of its route there; minion config storevirt:address says it
    where the route cannot).

    CLI Example: salt hv storevirt.tls_request
    """
    address = __salt__["config.get"]("storevirt:address", None) or __utils__[
        "store_libvirt_tls.address_toward"](__opts__["master"])
    return __utils__["store_libvirt_tls.request"](_pki_dir(), __opts__["id"], address)


def tls_install(ca_pem, cert_pem):
    """Install the certificate the master's CA signed for this host's key (refused when it is
    for another key or not signed by `ca_pem`) as libvirt's server and client certificate, with
    the CA, and have libvirtd reread them (minion config storevirt:tls_reload, default
    `virt-admin -c virtproxyd:///system server-update-tls virtproxyd`) when anything changed.

    CLI Example: salt hv storevirt.tls_install "$(cat ca.pem)" "$(cat hv.pem)"
    """
    changed = __utils__["store_libvirt_tls.install"](_pki_dir(), ca_pem, cert_pem)
    if changed:
        __utils__["store_libvirt_tls.reload"](
            __salt__["config.get"]("storevirt:tls_reload", None) or TLS_RELOAD)
    return {"changed": changed, "reloaded": changed}


def tls_status():
    """This host's libvirt certificate: subject CN, SANs, not_after (UTC), the sha256 of the CA
    beside it and whether that CA verifies it; None when it has none.

    CLI Example: salt hv storevirt.tls_status
    """
    return __utils__["store_libvirt_tls.status"](_pki_dir())


# -- the store VM's move to the store's new box (issue 48) ------------------------------------


def _move_record_path(name):
    return __utils__["store_vm_move.record_path"](_images_dir(), name)


def _write_move_record(name, record):
    path = _move_record_path(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return __utils__["store_vm_disks.write_json"](path, record)


def _inactive_root(dom):
    import libvirt

    return ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def move_state(name):
    """Where domain `name` stands on this host for a move: defined, running, the move record
    (<images>/<name>/move.json) and its disks (path, format, virtual size, backing file).

    CLI Example: salt hv storevirt.move_state store-0001-vm
    """
    conn = _connect()
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        paths = __utils__["store_vm_move.disks_of"](_inactive_root(dom)) if dom else []
        state = {"defined": dom is not None, "running": bool(dom and dom.isActive())}
    finally:
        conn.close()
    state["record"] = __utils__["store_vm_disks.read_json"](_move_record_path(name))
    state["disks"] = [__utils__["store_vm_move.disk_info"](p) for p in paths if os.path.exists(p)]
    return state


def prepare_incoming(name, disks):
    """The new box, before a live migration: each of `disks` (move_state's on the old box)
    made at the same path (qcow2 on the same backing file, which must be here; raw sparse of
    the same size). Refused when a domain `name` is here already. Idempotent.

    CLI Example: salt new-hv storevirt.prepare_incoming store-0001-vm '[{path: ..., ...}]'
    """
    conn = _connect()
    try:
        if __utils__["store_domain_inspect.lookup"](conn, name) is not None:
            raise CommandExecutionError(
                "prepare_incoming {}: a domain of that name is defined on this host already "
                "(the VM is here: see storevirt.move_state); nothing written".format(name))
    finally:
        conn.close()
    for disk in disks:
        __utils__["store_vm_move.check_disk_path"](_images_dir(), name, disk["path"],
                                                   "prepare_incoming")
    created = [disk["path"] for disk in disks if __utils__["store_vm_move.precreate"](disk)]
    return {"created": created}


def migrate_live(name, target_address, target_id, timeout=1800):
    """The old box (KVM): live-migrate running domain `name` with its disks' content to the
    store's new box `target_id` at `target_address` (libvirt peer-to-peer over TLS, the
    destination persistent, the source undefined; the new box's disks precreated by
    prepare_incoming). The move record says so before anything moves; phase "moved" after.
    Aborted after `timeout` seconds (the VM stays here, running).

    CLI Example: salt hv storevirt.migrate_live store-0001-vm 10.0.1.12 store-0001-hv-a1b2c3
    """
    import libvirt

    # VIR_MIGRATE_TLS: QEMU's memory and disk (NBD) streams over TLS too, with the same
    # certificates (tls_install writes them to <pki>/qemu), not only libvirt's control channel
    flags = (libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
             | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
             | libvirt.VIR_MIGRATE_NON_SHARED_INC | libvirt.VIR_MIGRATE_TLS)
    uri = __utils__["store_vm_move.tls_uri"](target_address, _pki_dir(), False,
                                             _local_uri())
    conn = _connect()
    try:
        dom = _domain(conn, name)
        if not dom.isActive():
            raise CommandExecutionError(
                "migrate_live {}: the domain is not running; a live migration moves a running "
                "VM (a stopped one moves with storevirt.send_disks)".format(name))
        record = _write_move_record(name, {
            "to": target_id, "address": target_address, "mode": "live", "phase": "migrating",
            "started_at": time.time()})
        try:
            result = __utils__["store_vm_move.migrate"](dom, uri, flags, float(timeout),
                                                        target_address)
        except (libvirt.libvirtError, CommandExecutionError) as exc:
            record.update(phase="failed", error=str(exc)[:500])
            _write_move_record(name, record)
            raise CommandExecutionError("migrate_live {} to {} ({}): {}".format(
                name, target_id, target_address, exc))
    finally:
        conn.close()
    there = __utils__["store_vm_move.completed_stats"](
        __utils__["store_vm_move.tls_uri"](target_address, _pki_dir(), True, _local_uri()),
        name)
    if there:
        result["bytes"] = max(result["bytes"], __utils__["store_vm_move.moved_bytes"](there))
        if there.get("downtime") is not None:
            result["downtime_ms"] = there["downtime"]
    record.update(phase="moved", moved_at=time.time(), **result)
    _write_move_record(name, record)
    return result


def send_disks(name, target_address, target_id, limit_bytes=None, restart=False):
    """The old box, offline (Xen: libxl has no storage migration): copy shut-off domain
    `name`'s disks into the same paths on the store's new box `target_id` (its libvirtd over
    TLS, a storage volume upload), resumable: the move record keeps each disk's offset and a
    rerun goes on from there; holes and all-zero chunks are skipped. `limit_bytes`: send at
    most about that much now (the rest in a later call); `restart`: from the start (the
    copies' checksums differed). One call at a time: a second one, while the first still
    sends (a retry after a timeout), is refused. Returns each disk's bytes sent now and the
    sha256 of its source file (compare storevirt.disks_sha256 on the new box).

    CLI Example: salt hv storevirt.send_disks store-0001-vm 10.0.1.12 store-0001-hv-a1b2c3
    """
    import fcntl

    lock_path = _move_record_path(name) + ".lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise CommandExecutionError(
                "send_disks {}: another send_disks of it runs on this host; wait for it to "
                "end, then rerun (the record keeps its progress)".format(name))
        return _send_disks(name, target_address, target_id, limit_bytes, restart)


def _send_disks(name, target_address, target_id, limit_bytes, restart):
    import libvirt

    started = time.monotonic()
    conn = _connect()
    try:
        dom = _domain(conn, name)
        __utils__["store_vm_disks.inactive_domain"](dom, name, "send_disks")
        paths = __utils__["store_vm_move.disks_of"](_inactive_root(dom))
    finally:
        conn.close()
    record = __utils__["store_vm_disks.read_json"](_move_record_path(name)) or {}
    if restart or record.get("to") != target_id or record.get("mode") != "offline":
        record = {"to": target_id, "mode": "offline", "started_at": time.time(), "disks": {}}
    record.update(address=target_address, phase="copying")
    for path in paths:
        size = os.path.getsize(path)
        entry = record["disks"].setdefault(path, {"offset": 0, "size": size})
        if entry["size"] != size:
            entry.update(offset=0, size=size)
    _write_move_record(name, record)
    uri = __utils__["store_vm_move.tls_uri"](target_address, _pki_dir(), True, _local_uri())
    try:
        target = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise CommandExecutionError("send_disks {}: cannot reach {} at {}: {}".format(
            name, target_id, uri, exc))
    budget = None if limit_bytes is None else int(limit_bytes)
    # the utils module calls it back: a loaded function, not this module's (whose __utils__ is
    # not there in the utils module's loader context)
    save = functools.partial(__utils__["store_vm_disks.write_json"], _move_record_path(name),
                             record)
    sent = []
    # the utils call runs `save` in the utils loader's context, where this module's dunders do
    # not resolve (LazyLoader: no packed value for __utils__): resolved here, before the call
    record_path, write_json = _move_record_path(name), __utils__["store_vm_disks.write_json"]

    def save():
        return write_json(record_path, record)
    try:
        pool = __utils__["store_vm_move.storage_pool"](
            target, os.path.join(_images_dir(), name))
        for path in paths:
            entry = record["disks"][path]
            now = __utils__["store_vm_move.send_file"](
                target, pool, path, entry, None if budget is None else max(budget, 0),
                save)
            budget = None if budget is None else budget - now
            sent.append({"path": path, "bytes_sent": now, "offset": entry["offset"],
                         "sha256": __utils__["store_vm_move.file_sha256"](path)})
            if entry["offset"] < entry["size"]:
                break
    except libvirt.libvirtError as exc:
        raise CommandExecutionError("send_disks {} to {}: {} (a rerun goes on from the "
                                    "record's offsets)".format(name, target_id, exc))
    finally:
        target.close()
    complete = all(e["offset"] >= e["size"] for e in record["disks"].values())
    if complete:
        record.update(phase="copied", copied_at=time.time())
        _write_move_record(name, record)
    return {"disks": sent, "complete": complete,
            "seconds": round(time.monotonic() - started, 1)}


def disks_sha256(name, paths=None):
    """The new box: {path: sha256} of VM `name`'s disks here (`paths`, else its data disk and
    system disks in <images>/<name>).

    CLI Example: salt new-hv storevirt.disks_sha256 store-0001-vm
    """
    if paths is None:
        paths = __utils__["store_vm_disks.disk_files"](_images_dir(), name)
    return {path: __utils__["store_vm_move.file_sha256"](path) for path in paths
            if os.path.isfile(path)}


def domain_xml(name):
    """The old box: domain `name`'s inactive definition (no secrets), for define_incoming.

    CLI Example: salt hv storevirt.domain_xml store-0001-vm
    """
    conn = _connect()
    try:
        return ET.tostring(_inactive_root(_domain(conn, name)), encoding="unicode")
    finally:
        conn.close()


def define_incoming(name, xml):
    """The new box, offline path: define domain `name` from the old box's `xml` unchanged (same
    UUID, MAC, disk paths; each disk must be here), autostart on, not started. Idempotent; a
    domain of that name with another UUID is refused.

    CLI Example: salt new-hv storevirt.define_incoming store-0001-vm "$(cat vm.xml)"
    """
    root = ET.fromstring(xml)
    if root.findtext("name") != name:
        raise CommandExecutionError("define_incoming {}: the XML defines {!r}; nothing "
                                    "defined".format(name, root.findtext("name")))
    missing = [p for p in __utils__["store_vm_move.disks_of"](root) if not os.path.exists(p)]
    if missing:
        raise CommandExecutionError("define_incoming {}: disk(s) not on this host: {}; send "
                                    "them first (storevirt.send_disks on the old box)".format(
                                        name, ", ".join(missing)))
    conn = _connect()
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        if dom is not None and dom.UUIDString() != root.findtext("uuid"):
            raise CommandExecutionError(
                "define_incoming {}: a domain of that name with another UUID ({}) is defined "
                "here; nothing defined".format(name, dom.UUIDString()))
        if dom is None:
            dom = conn.defineXML(xml)
        dom.setAutostart(1)
    finally:
        conn.close()
    return domain_summary(name)


def _finished_move(name, what, phases):
    record = __utils__["store_vm_disks.read_json"](_move_record_path(name))
    if not record or record.get("phase") not in phases:
        raise CommandExecutionError(
            "{} {}: the move record ({}) says {}; only a VM whose move got that far is "
            "{}".format(what, name, _move_record_path(name),
                        "phase " + repr(record.get("phase")) if record else "nothing",
                        "undefined here" if what == "release_moved" else "forgotten here"))
    return record


def release_moved(name):
    """The old box, offline path, once the VM runs on the new box: shut-off domain `name`
    undefined here (so this box never starts it again), its disks kept until forget_moved;
    the record's phase "moved". Idempotent.

    CLI Example: salt hv storevirt.release_moved store-0001-vm
    """
    record = _finished_move(name, "release_moved", ("copied", "moved"))
    conn = _connect()
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        if dom is not None:
            __utils__["store_vm_disks.inactive_domain"](dom, name, "release_moved")
            dom.undefine()
    finally:
        conn.close()
    if record["phase"] != "moved":
        record.update(phase="moved", moved_at=time.time())
        _write_move_record(name, record)
    return record


def forget_moved(name):
    """The old box, after the new box's gate passed: domain `name` undefined if still defined
    (never a running one), its disk files and the move record removed: the data lives on the
    new box now. Refused unless the record says the move finished. Idempotent.

    CLI Example: salt hv storevirt.forget_moved store-0001-vm
    """
    path = _move_record_path(name)
    if not os.path.exists(path) and not os.path.isdir(os.path.dirname(path)):
        return {"undefined": False, "removed": False}
    record = __utils__["store_vm_disks.read_json"](path) or {}
    conn = _connect()
    try:
        gone = __utils__["store_domain_inspect.lookup"](conn, name) is None
    finally:
        conn.close()
    # a live move whose record never said "moved" (this minion restarted as the migration
    # ended): libvirt undefined the domain here as it finished, the record is all that is left
    if not (gone and record.get("mode") == "live" and record.get("phase") in ("migrating",
                                                                            "failed")):
        _finished_move(name, "forget_moved", ("moved",))
    conn = _connect()
    undefined = False
    try:
        dom = __utils__["store_domain_inspect.lookup"](conn, name)
        if dom is not None:
            __utils__["store_vm_disks.inactive_domain"](dom, name, "forget_moved")
            dom.undefine()
            undefined = True
    finally:
        conn.close()
    removed, _data = __utils__["store_vm_disks.remove_vm_files"](_images_dir(), name, False)
    return {"undefined": undefined, "removed": removed}
