"""The rules of Agama's profile schema that our profile (image_builds/agama/sle16-kvm.json) is
subject to, written from agama-project/agama's schema files (not a copy of them): the 16.0
installer's `rust/agama-lib/share/profile.schema.json` and `storage.schema.json` on branch SLE-16
(draft 2019-09), checked to hold for master's `rust/share/` too (16.1 adds keys, removes none we
use). Only the parts of the schema our profile uses are spelled out; a key of a part it does not
use is refused, so a new key in the profile needs its rule here first.

`problems(profile)` lists what breaks a rule, by JSON path; empty means it follows them.
"""

from __future__ import annotations

import re
from typing import Any

# profile.schema.json: "additionalProperties": false at the top, these properties (16.0's;
# master adds $schema, proxy, ntp, l10n, access)
TOP_LEVEL = {"files", "scripts", "bootloader", "dasd", "zfcp", "hostname", "security",
             "software", "questions", "product", "network", "user", "root", "localization",
             "storage", "legacyAutoyastStorage", "iscsi"}
PRODUCT = {"id", "registrationCode", "registrationEmail", "registrationUrl", "addons"}
ROOT = {"password", "hashedPassword", "sshPublicKey"}
HOSTNAME = {"static", "transient"}
BOOTLOADER = {"stopOnBootMenu", "timeout", "extraKernelParams"}
# $defs/file and $defs/postScript (additionalProperties false; oneOf the sources)
FILE = {"destination", "content", "url", "permissions", "user", "group"}
SCRIPT_GROUPS = {"pre", "postPartitioning", "post", "init"}
POST_SCRIPT = {"name", "body", "content", "url", "chroot"}
SOFTWARE = {"patterns", "packages", "onlyRequired", "extraRepositories"}
REPOSITORY = {"alias", "url", "priority", "name", "productDir", "enabled", "allowUnsigned",
              "gpgFingerprints"}
NETWORK = {"connections"}
CONNECTION = {"id", "interface", "customMacAddress", "macAddress", "mtu", "method4", "method6",
              "gateway4", "gateway6", "addresses", "nameservers", "dnsSearchlist",
              "ignoreAutoDns", "status", "autoconnect", "persistent", "wireless", "bond",
              "bridge", "vlan", "ieee-8021x", "match"}
METHODS = {"auto", "manual", "link-local", "disabled"}
BRIDGE = {"stp", "forwardDelay", "priority", "maxAge", "helloTime", "ports"}
# storage.schema.json
STORAGE = {"boot", "drives", "volumeGroups", "mdRaids"}
PARTITIONED_DRIVE = {"search", "alias", "ptableType", "partitions"}
PARTITION = {"search", "alias", "id", "size", "encryption", "filesystem"}
FILESYSTEM = {"reuseIfPossible", "type", "label", "path", "mountBy", "mkfsOptions",
              "mountOptions"}
FILESYSTEM_TYPES = {"bcachefs", "btrfs", "exfat", "ext2", "ext3", "ext4", "f2fs", "jfs", "nfs",
                    "nilfs2", "ntfs", "reiserfs", "swap", "tmpfs", "vfat", "xfs"}
SIZE_STRING = re.compile(r"^[0-9]+(\.[0-9]+)?(\s*([KkMmGgTtPpEeZzYy][iI]?)?[Bb])?$")


class _Check:
    def __init__(self) -> None:
        self.found: list[str] = []

    def fail(self, path: str, what: str) -> None:
        self.found.append(f"{path or '/'}: {what}")

    def obj(self, value: Any, path: str, allowed: set[str],
            required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"an object, not {type(value).__name__}")
            return {}
        for key in sorted(set(value) - allowed):
            self.fail(path, f"key {key!r} is not allowed")
        for key in required:
            if key not in value:
                self.fail(path, f"required key {key!r} missing")
        return value

    def array(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"an array, not {type(value).__name__}")
            return []
        return value

    def typed(self, value: dict[str, Any], path: str, kind: type | tuple[type, ...],
              *keys: str) -> None:
        for key in keys:
            wrong_bool = isinstance(value.get(key), bool) and bool not in (
                kind if isinstance(kind, tuple) else (kind,))
            if key in value and (not isinstance(value[key], kind) or wrong_bool):
                self.fail(f"{path}/{key}", f"a {getattr(kind, '__name__', kind)}, not "
                                           f"{value[key]!r}")

    def strings(self, value: Any, path: str) -> None:
        for n, item in enumerate(self.array(value, path)):
            if not isinstance(item, str):
                self.fail(f"{path}/{n}", f"a string, not {item!r}")

    def one_source(self, value: dict[str, Any], path: str, sources: tuple[str, ...]) -> None:
        given = [s for s in sources if s in value]
        if len(given) != 1:
            self.fail(path, f"exactly one of {', '.join(sources)} (oneOf), found {given}")


def _size(c: _Check, size: Any, path: str) -> None:
    def value(v: Any, where: str) -> None:
        if isinstance(v, bool) or not (isinstance(v, int) and v >= 0 or isinstance(v, str)
                                       and SIZE_STRING.match(v)):
            c.fail(where, f"a size (bytes or a string like '4 GiB'), not {v!r}")
    if isinstance(size, dict):
        c.obj(size, path, {"min", "max"}, ("min",))
        for key in ("min", "max"):
            if key in size:
                value(size[key], f"{path}/{key}")
    else:
        value(size, path)


def _storage(c: _Check, storage: Any) -> None:
    storage = c.obj(storage, "/storage", STORAGE)
    for d, drive in enumerate(c.array(storage.get("drives", []), "/storage/drives")):
        where = f"/storage/drives/{d}"
        drive = c.obj(drive, where, PARTITIONED_DRIVE, ("partitions",))
        for p, part in enumerate(c.array(drive.get("partitions", []), f"{where}/partitions")):
            at = f"{where}/partitions/{p}"
            if isinstance(part, dict) and "delete" in part:  # $defs/partitionToDelete
                c.obj(part, at, {"search", "delete"}, ("search", "delete"))
                if part.get("delete") is not True:
                    c.fail(f"{at}/delete", "must be true")
                continue
            part = c.obj(part, at, PARTITION)
            if "size" in part:
                _size(c, part["size"], f"{at}/size")
            fs = c.obj(part.get("filesystem", {}), f"{at}/filesystem", FILESYSTEM)
            if "type" in fs and fs["type"] not in FILESYSTEM_TYPES:
                c.fail(f"{at}/filesystem/type", f"not one of the schema's types: {fs['type']!r}")
            c.typed(fs, f"{at}/filesystem", str, "path", "label")


def _network(c: _Check, network: Any) -> None:
    network = c.obj(network, "/network", NETWORK)
    for n, conn in enumerate(c.array(network.get("connections", []), "/network/connections")):
        at = f"/network/connections/{n}"
        conn = c.obj(conn, at, CONNECTION, ("id",))
        c.typed(conn, at, str, "id", "interface", "macAddress", "customMacAddress", "gateway4")
        for key in ("method4", "method6"):
            if key in conn and conn[key] not in METHODS:
                c.fail(f"{at}/{key}", f"not one of {sorted(METHODS)}: {conn[key]!r}")
        for key in ("addresses", "nameservers"):
            if key in conn:
                c.strings(conn[key], f"{at}/{key}")
        if "bridge" in conn:
            bridge = c.obj(conn["bridge"], f"{at}/bridge", BRIDGE)
            c.typed(bridge, f"{at}/bridge", bool, "stp")
            c.typed(bridge, f"{at}/bridge", int, "forwardDelay", "priority")
            if "ports" in bridge:
                c.strings(bridge["ports"], f"{at}/bridge/ports")


def _software(c: _Check, software: Any) -> None:
    software = c.obj(software, "/software", SOFTWARE)
    c.typed(software, "/software", bool, "onlyRequired")
    for key in ("patterns", "packages"):
        if key in software:
            c.strings(software[key], f"/software/{key}")
    for n, repo in enumerate(c.array(software.get("extraRepositories", []),
                                     "/software/extraRepositories")):
        repo = c.obj(repo, f"/software/extraRepositories/{n}", REPOSITORY, ("alias", "url"))
        c.typed(repo, f"/software/extraRepositories/{n}", str, "alias", "url", "name")


def _files_and_scripts(c: _Check, profile: dict[str, Any]) -> None:
    for n, entry in enumerate(c.array(profile.get("files", []), "/files")):
        entry = c.obj(entry, f"/files/{n}", FILE, ("destination",))
        c.one_source(entry, f"/files/{n}", ("url", "content"))
        c.typed(entry, f"/files/{n}", str, "destination", "content", "permissions", "user",
                "group")
    scripts = c.obj(profile.get("scripts", {}), "/scripts", SCRIPT_GROUPS)
    for n, script in enumerate(c.array(scripts.get("post", []), "/scripts/post")):
        script = c.obj(script, f"/scripts/post/{n}", POST_SCRIPT, ("name",))
        c.one_source(script, f"/scripts/post/{n}", ("body", "url", "content"))
        c.typed(script, f"/scripts/post/{n}", str, "name", "content", "body")
        c.typed(script, f"/scripts/post/{n}", bool, "chroot")


def problems(profile: Any) -> list[str]:
    """What in `profile` breaks the schema's rules for the parts our profile uses."""
    c = _Check()
    profile = c.obj(profile, "", TOP_LEVEL)
    product = c.obj(profile.get("product"), "/product", PRODUCT, ("id",))
    c.typed(product, "/product", str, "id", "registrationCode", "registrationUrl")
    root = c.obj(profile.get("root", {}), "/root", ROOT)
    c.typed(root, "/root", str, "password", "sshPublicKey")
    c.typed(root, "/root", bool, "hashedPassword")
    c.typed(c.obj(profile.get("hostname", {}), "/hostname", HOSTNAME), "/hostname", str,
            "static", "transient")
    bootloader = c.obj(profile.get("bootloader", {}), "/bootloader", BOOTLOADER)
    c.typed(bootloader, "/bootloader", int, "timeout")
    c.typed(bootloader, "/bootloader", str, "extraKernelParams")
    if isinstance(bootloader.get("timeout"), int) and bootloader["timeout"] < 0:
        c.fail("/bootloader/timeout", "minimum 0")
    _storage(c, profile.get("storage", {}))
    _network(c, profile.get("network", {}))
    _software(c, profile.get("software", {}))
    _files_and_scripts(c, profile)
    return c.found
