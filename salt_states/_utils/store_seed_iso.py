"""The store VM's identity seed (storevirt.seed_identity, retire_seed, domain_summary), a Salt
utils module: __utils__["store_seed_iso.*"] in execution modules, synced from salt://_utils.

The VM's identity (minion id, one-time autosign token) travels on a small read-only seed disk:
an ISO 9660 image labelled STORE_SEED, attached as the domain's CD-ROM, which the image's
store-identity service reads at boot. It works on Xen (libxl) and KVM alike; SMBIOS OEM strings
do not (libvirt's libxl driver ignores <sysinfo>), and guestfs seeding is out (salt#56002). Once
firstboot is done the CD-ROM is ejected and the ISO deleted, so the token does not linger. The
domain's <metadata> records whose identity was seeded and whether the seed is attached or
retired (never the token).

Python 3.6 and Salt 3006.0 (a Leap 15.6 store host) as well as Salt 3008.
"""

import os
import re
import subprocess
import tempfile
import xml.etree.ElementTree as ET

from salt.exceptions import CommandExecutionError

# the seed contract, shared with the image's store-identity script (tests check both agree)
SEED_LABEL = "STORE_SEED"
SEED_FILE = "identity.env"
SEED_ISO = "seed.iso"
SEED_KEYS = ("minion_id", "store_id", "autosign_token")
SEED_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SEED_METADATA_NS = "https://github.com/store-rollout/seed"
METADATA_PREFIX = "storerollout"

# capture_output= and text= are Python 3.7: a Leap 15.6 minion runs 3.6 (store-stack.md)
_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}


def seed_path(images_dir, name):
    """Where VM `name`'s identity seed ISO lives on this hypervisor (next to its disk)."""
    return os.path.join(images_dir, name, SEED_ISO)


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


def attach(dom, name, path, identity):
    """Write VM `name`'s seed ISO at `path` and point the seed CD-ROM of its domain `dom` at it
    (persistent definition). The domain must have that CD-ROM and must not run: the guest
    reads the seed at boot."""
    import libvirt

    if dom.isActive():
        raise CommandExecutionError(f"domain {name} is running; stop it before seeding")
    write_seed(path, identity)
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


def eject(dom, path):
    """Eject the seed CD-ROM (source `path`) of domain `dom`, running and persistent
    definition, and mark its seed retired. Idempotent; the ISO file is the caller's."""
    import libvirt

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


def seed_state(root, path):
    """Whose identity was seeded into the domain whose XML is `root`, and whether its seed
    (`path`) is still attached (never the token)."""
    disk = _seed_cdrom(root, path)
    return dict(_seed_metadata(root), attached=bool(
        disk is not None and _source_file(disk) is not None))


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


def _seed_metadata(root):
    element = root.find(f"./metadata/{{{SEED_METADATA_NS}}}seed")
    return {} if element is None else dict(element.attrib)
