"""Hypervisor-side helpers for the store VM, next to saltext-virt's `virt` module.

- the base image is cached once per hypervisor (image + meta.json, keyed by content hash);
- each VM disk is a qcow2 overlay on it (backing file), never a copy; the base is read-only;
- the VM's identity (minion id, one-time autosign token) travels on a small read-only seed
  disk: an ISO 9660 image labelled STORE_SEED, attached as the domain's CD-ROM, which the
  image's store-identity service reads at boot. It works on Xen (libxl) and KVM alike; SMBIOS
  OEM strings do not (libvirt's libxl driver ignores <sysinfo>), and guestfs seeding is out
  (salt#56002). Once firstboot is done the CD-ROM is ejected and the ISO deleted, so the token
  does not linger. The domain's <metadata> records whose identity was seeded and whether the
  seed is attached or retired (never the token).
"""

import fcntl
import hashlib
import json
import os
import re
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError

__virtualname__ = "storevirt"

# the seed contract, shared with the image's store-identity script (tests check both agree)
SEED_LABEL = "STORE_SEED"
SEED_FILE = "identity.env"
SEED_ISO = "seed.iso"
SEED_KEYS = ("minion_id", "store_id", "autosign_token")
SEED_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SEED_METADATA_NS = "https://github.com/store-rollout/seed"
METADATA_PREFIX = "storerollout"


def __virtual__():
    return __virtualname__


def _images_dir():
    return __salt__["config.get"]("virt:images", "/srv/salt-images")


def _connect():
    import libvirt

    uri = __salt__["config.get"]("virt:connection:uri", None)
    return libvirt.open(uri)


# capture_output= and text= are Python 3.7: a Leap 15.6 minion runs 3.6 (store-stack.md)
_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}

DOWNLOAD_CHUNK = 256 * 1024
DOWNLOAD_CUT = "download cut"  # the orchestrator retries (resumes) on this


def _sha256_of(path, digest):
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(DOWNLOAD_CHUNK), b""):
            digest.update(block)
    return digest


def _open_url(url, offset, ca_pem, timeout):
    headers = {"Range": "bytes={}-".format(offset)} if offset else {}
    request = urllib.request.Request(url, headers=headers)
    context = None
    if url.startswith("https://"):
        # TLS is always verified: the system's trust store, or the CA the settings name
        context = ssl.create_default_context(cadata=ca_pem) if ca_pem \
            else ssl.create_default_context()
    return urllib.request.urlopen(request, timeout=timeout, context=context)


def ensure_base_image(source, key, sha256, meta=None, ca_pem=None, rate_limit=None,
                      timeout=60):
    """Cache the base image `source` (an http(s):// URL) as <images>/base/<key>/image.qcow2.

    - verified: its sha256 must be `sha256` before it gets its final name; a mismatch removes
      the download and fails naming the image, both digests and the URL;
    - resumable: a cut download stays as image.qcow2.part and the next call asks for the rest
      (HTTP Range) instead of starting again;
    - atomic: the final name only ever holds a verified image;
    - TLS verified against the system trust store or `ca_pem` (PEM text), never skipped;
    - paced to `rate_limit` bytes/s when given, so a wave does not fill the store links.

    Returns what it did: path, bytes transferred now, the offset it resumed from, seconds.

    CLI Example: salt hv storevirt.ensure_base_image https://images/abc/image.qcow2 abc <sha256>
    """
    base_dir = os.path.join(_images_dir(), "base", key)
    dest = os.path.join(base_dir, "image.qcow2")
    result = {"path": dest, "transferred": 0, "resumed_from": 0, "seconds": 0.0,
              "cached": os.path.exists(dest)}
    if result["cached"]:
        return result
    if not source.startswith(("http://", "https://")):
        raise CommandExecutionError(
            "image {}: {} is not an http(s) URL; the hypervisor downloads its base image from "
            "the image server (setting image_base_url)".format(key, source))
    os.makedirs(base_dir, exist_ok=True)
    # one download per base image on this host: a concurrent call (another VM of the
    # same image, a rerun) waits here, then finds the verified image
    with open(os.path.join(base_dir, ".download.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(dest):
            result["cached"] = True
            return result
        return _download(source, key, sha256, meta, ca_pem, rate_limit, timeout, dest,
                         result)


def _download(source, key, sha256, meta, ca_pem, rate_limit, timeout, dest, result):
    """ensure_base_image's transfer, under its lock."""
    import http.client

    base_dir = os.path.dirname(dest)
    part = dest + ".part"
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    digest = _sha256_of(part, hashlib.sha256()) if offset else hashlib.sha256()
    started = time.monotonic()
    try:
        response = _open_url(source, offset, ca_pem, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            response = None  # nothing left to fetch: verify what we have
        else:
            raise CommandExecutionError("image {}: GET {} answered HTTP {} {}".format(
                key, source, exc.code, exc.reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandExecutionError("image {}: cannot fetch {}: {}".format(
            key, source, reason)) from None
    if response is not None:
        with response:
            if offset and response.status != 206:  # the server ignored the range
                offset, digest = 0, hashlib.sha256()
            result["resumed_from"] = offset
            chunk_size = min(DOWNLOAD_CHUNK, int(rate_limit)) if rate_limit else DOWNLOAD_CHUNK
            with open(part, "ab" if offset else "wb") as out:
                try:
                    for block in iter(lambda: response.read(chunk_size), b""):
                        out.write(block)
                        digest.update(block)
                        result["transferred"] += len(block)
                        if rate_limit:
                            ahead = result["transferred"] / float(rate_limit) - (
                                time.monotonic() - started)
                            if ahead > 0:
                                time.sleep(ahead)
                except (http.client.IncompleteRead, OSError) as exc:
                    cut = str(exc)
                else:
                    # a closed connection ends the body early without an error: count it
                    expected = int(response.headers.get("Content-Length") or -1)
                    cut = "{} of {} bytes".format(result["transferred"], expected) \
                        if 0 <= expected != result["transferred"] else None
            if cut:
                raise CommandExecutionError(
                    "image {}: {} from {} at {} bytes ({}); the next attempt resumes "
                    "there".format(key, DOWNLOAD_CUT, source, offset + result["transferred"],
                                   cut))
    actual = digest.hexdigest()
    if actual != sha256:
        os.remove(part)
        raise CommandExecutionError(
            "image {}: sha256 mismatch for {}: expected {}, got {}; the download was "
            "removed".format(key, source, sha256, actual))
    if meta is not None:
        with open(os.path.join(base_dir, "meta.json"), "w") as fh:
            json.dump(meta, fh, indent=2)
    os.chmod(part, 0o444)  # the base is never written: overlays only
    os.replace(part, dest)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def create_overlay(name, base, size_mib=None):
    """qcow2 overlay for VM `name` on `base`; an existing overlay on the same base is kept."""
    vm_dir = os.path.join(_images_dir(), name)
    disk = os.path.join(vm_dir, "system.qcow2")
    if os.path.exists(disk):
        info = json.loads(subprocess.run(
            ["qemu-img", "info", "--force-share", "--output=json", disk],
            check=True, **_CAPTURE_TEXT).stdout)
        if info.get("full-backing-filename", info.get("backing-filename")) != base:
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
    return os.path.join(_images_dir(), name, SEED_ISO)


def _seed_text(identity):
    unknown = sorted(set(identity) - set(SEED_KEYS))
    if unknown:
        raise CommandExecutionError(f"seed identity: unknown keys {unknown}; allowed {SEED_KEYS}")
    if not identity.get("minion_id"):
        raise CommandExecutionError("seed identity: minion_id is required")
    lines = []
    for key in SEED_KEYS:
        value = str(identity.get(key) or "")
        if value and not SEED_VALUE.match(value):
            raise CommandExecutionError(
                f"seed identity: {key} is a value the guest refuses (it must start with a "
                "letter or digit and hold only letters, digits, '.', '_', '-', up to 128)")
        if value:
            lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def write_seed(path, identity):
    """Write the seed ISO (label STORE_SEED, file identity.env) to `path` atomically, mode 0600."""
    text = _seed_text(identity)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path), prefix=".seed-") as tmp:
        tree = os.path.join(tmp, "tree")
        os.mkdir(tree, 0o700)
        fd = os.open(os.path.join(tree, SEED_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        iso = os.path.join(tmp, SEED_ISO)
        # -R: Rock Ridge keeps the 0600 mode and the file name as is
        proc = subprocess.run(["xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", SEED_LABEL,
                               "-o", iso, tree], check=False, **_CAPTURE_TEXT)
        if proc.returncode != 0:
            raise CommandExecutionError(f"xorriso could not write the seed ISO: {proc.stderr}")
        os.chmod(iso, 0o600)
        os.replace(iso, path)
    return path


def _source_file(disk):
    """The file a disk's <source> names, or None (an ejected CD-ROM has no source, or, in a
    running domain's XML, a <source> without a file)."""
    source = disk.find("source")
    return None if source is None else source.get("file")


def _seed_cdrom(root, path):
    """The domain's seed CD-ROM element (source `path`, or an ejected CD-ROM), or None."""
    cdroms = root.findall("./devices/disk[@device='cdrom']")
    for disk in cdroms:
        if _source_file(disk) == path:
            return disk
    for disk in cdroms:
        if _source_file(disk) is None:
            return disk
    return None


def _set_cdrom_source(dom, disk, path, flags):
    for old in disk.findall("source"):
        disk.remove(old)
    if path:
        # the source goes before <target> (libvirt accepts any order; keep it readable)
        disk.insert(1, ET.Element("source", {"file": path}))
    dom.updateDeviceFlags(ET.tostring(disk, encoding="unicode"), flags)


def _set_seed_metadata(dom, identity, state, flags):
    import libvirt

    xml = (f"<seed minion_id='{identity.get('minion_id', '')}' "
           f"store_id='{identity.get('store_id', '')}' state='{state}'/>")
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, METADATA_PREFIX, SEED_METADATA_NS,
                    flags)


def seed_identity(name, identity):
    """Write VM `name`'s seed ISO and point its seed CD-ROM at it (persistent definition).

    The domain must be defined with that CD-ROM (store-rollout's virt.init arguments do) and
    must not run: the guest reads the seed at boot.

    CLI Example: salt hv storevirt.seed_identity store-0001-vm '{minion_id: store-0001-vm}'
    """
    import libvirt

    conn = _connect()
    try:
        dom = conn.lookupByName(name)
        if dom.isActive():
            raise CommandExecutionError(f"domain {name} is running; stop it before seeding")
        path = write_seed(seed_path(name), identity)
        root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        disk = _seed_cdrom(root, path)
        if disk is None:
            raise CommandExecutionError(
                f"domain {name} has no CD-ROM for its identity seed {path}; it was not defined "
                "by store-rollout (remove it: store-rollout rollback)")
        config = libvirt.VIR_DOMAIN_AFFECT_CONFIG
        if _source_file(disk) is None:
            _set_cdrom_source(dom, disk, path, config)
        public = {k: v for k, v in identity.items() if k != "autosign_token"}
        _set_seed_metadata(dom, public, "attached", config)
        return {"seed": path, "state": "attached"}
    finally:
        conn.close()


def retire_seed(name):
    """Eject VM `name`'s seed CD-ROM (running and persistent definition) and delete the ISO,
    so its one-time token does not outlive firstboot. Idempotent.

    CLI Example: salt hv storevirt.retire_seed store-0001-vm
    """
    import libvirt

    path = seed_path(name)
    conn = _connect()
    try:
        dom = conn.lookupByName(name)
        config = libvirt.VIR_DOMAIN_AFFECT_CONFIG
        live = libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() else 0
        for flags, xml_flags in ((live, 0), (config, libvirt.VIR_DOMAIN_XML_INACTIVE)):
            if not flags:
                continue
            disk = _seed_cdrom(ET.fromstring(dom.XMLDesc(xml_flags)), path)
            if disk is not None and _source_file(disk) is not None:
                _set_cdrom_source(dom, disk, None, flags)
        seed = _seed_metadata(ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)))
        _set_seed_metadata(dom, seed, "retired", config | live)
    finally:
        conn.close()
    removed = os.path.exists(path)
    if removed:
        os.remove(path)
    return {"seed": path, "state": "retired", "deleted": removed}


def _seed_metadata(root):
    element = root.find(f"./metadata/{{{SEED_METADATA_NS}}}seed")
    return {} if element is None else dict(element.attrib)


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
                check=True, **_CAPTURE_TEXT).stdout)
            backing = info.get("full-backing-filename", info.get("backing-filename"))
        graphics = root.find("./devices/graphics")
        seed_disk = _seed_cdrom(root, seed_path(name))
        return {
            "name": name, "uuid": dom.UUIDString(), "active": bool(dom.isActive()),
            "autostart": bool(dom.autostart()),
            "disk": disk, "backing": backing,
            "graphics": None if graphics is None else {
                "type": graphics.get("type"), "listen": graphics.get("listen")},
            # whose identity was seeded and whether the seed is still attached (no token)
            "seed": dict(_seed_metadata(root), attached=bool(
                seed_disk is not None and _source_file(seed_disk) is not None)),
        }
    finally:
        conn.close()


def inspect(wanted):
    """Read-only: this host's part of `wanted`, {minion id: {"domains": [names],
    "base_images": [keys]}}, as {"domains": {name: domain_summary or None},
    "base_images": {key: cached}}. One job answers for many hypervisors (plan, reconcile):
    each minion picks its own entry.

    CLI Example: salt -L hv1,hv2 storevirt.inspect '{hv1: {domains: [store-0001-vm]}}'
    """
    mine = (wanted or {}).get(__opts__["id"]) or {}
    base_dir = os.path.join(_images_dir(), "base")
    return {
        "domains": {name: domain_summary(name) for name in mine.get("domains", [])},
        "base_images": {key: os.path.exists(os.path.join(base_dir, key, "image.qcow2"))
                        for key in mine.get("base_images", [])},
    }


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
