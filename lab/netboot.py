"""A store host's real network boot in the full lab: what its PXE ROM loads, and what the
simulator reads back once the host boots from its disk.

The boot goes as on a store: the domain's iPXE ROM asks for DHCP on the store network and gets
PXELINUX over TFTP from the dnsmasq Cobbler manages (lab/cobbler_dhcp.py); PXELINUX reads
Cobbler's per-MAC configuration over TFTP and loads the distro's kernel and initrd. In the lab
the distro is Debian's kernel with the lab's installer (`installer/init`, busybox): it takes
an address by DHCP, fetches the profile from Cobbler over HTTP (Agama's JSON from `inst.auto=`,
read by `installer/agama.awk`, or AutoYaST's XML from `autoyast=`, by `installer/profile.awk`),
writes the files the profile lays down, runs its non-chrooted scripts (Cobbler's nopxe), writes
the result to the host's disk and reboots. With netboot off, PXELINUX hands back to the BIOS, which boots the
disk: its boot sector prints `DISK_BOOT_MARKER` on the serial console and halts, and from there
the simulator runs the installed host (lab/simulator/firmware.py) from the files on the disk.

The disk: the boot sector, then from `INSTALL_OFFSET` a tar of the installed files.
Inputs come out of Debian packages the Makefile unpacks into `.cache/netboot/` (never installed).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from lab.state import REPO_ROOT, LabInfo

NETBOOT_ROOT = REPO_ROOT / ".cache" / "netboot" / "root"
INSTALLER_DIR = Path(__file__).resolve().parent / "installer"
PXELINUX = NETBOOT_ROOT / "usr" / "lib" / "PXELINUX" / "pxelinux.0"
LDLINUX = NETBOOT_ROOT / "usr" / "lib" / "syslinux" / "modules" / "bios" / "ldlinux.c32"
BUSYBOX = NETBOOT_ROOT / "bin" / "busybox"
# the drivers the installer needs for the domain's virtio NIC and disk (their dependencies
# are read from the modules themselves)
MODULES = ("virtio_pci", "virtio_net", "virtio_blk")
INSTALL_OFFSET = 1024 * 1024
INSTALL_ID_FILE = "etc/store-rollout-lab/install-id"
DISK_BOOT_MARKER = "store-host: booted from disk"
INSTALLER_DONE_MARKER = "store-installer: installed"
INSTALLER_FAILED_MARKER = "store-installer: FAILED"
DISK_MIB = 16


def _boot_sector() -> bytes:
    """Real-mode code at 0x7c00: print DISK_BOOT_MARKER on COM1, then halt with interrupts off
    (an idle vCPU, not a spinning one)."""
    message = f"\r\n{DISK_BOOT_MARKER}\r\n".encode() + b"\0"
    code = bytes([
        0xFA,              # cli
        0x31, 0xC0,        # xor ax, ax
        0x8E, 0xD8,        # mov ds, ax
        0xBE, 0x16, 0x7C,  # mov si, 0x7c16 (the message, right after the code)
        0xBA, 0xF8, 0x03,  # mov dx, 0x3f8 (COM1)
        0xAC,              # .next: lodsb
        0x84, 0xC0,        # test al, al
        0x74, 0x03,        # jz .halt
        0xEE,              # out dx, al
        0xEB, 0xF8,        # jmp .next
        0xF4,              # .halt: hlt
        0xEB, 0xFD,        # jmp .halt
    ])
    assert len(code) == 0x16
    sector = code + message
    return sector.ljust(510, b"\0") + b"\x55\xaa"


BOOT_SECTOR = _boot_sector()


@dataclass(frozen=True)
class HostFiles:
    """A full-lab store host's disk and serial console log, beside the lab's VM images."""

    disk: Path
    console: Path

    def create(self) -> None:
        """A blank disk (a new machine's): nothing to boot until the installer wrote it."""
        self.disk.parent.mkdir(parents=True, exist_ok=True)
        with self.disk.open("wb") as fh:
            fh.truncate(DISK_MIB * 1024 * 1024)
        self.console.touch()


def host_files(info: LabInfo, system_name: str) -> HostFiles:
    base = Path(info.vm_images_dir).parent / "store-hosts" / system_name
    return HostFiles(base / "disk.raw", base / "console.log")


@dataclass(frozen=True)
class Kernel:
    vmlinuz: Path
    modules_dir: Path  # lib/modules/<version>/kernel


def kernel() -> Kernel:
    found = sorted(NETBOOT_ROOT.glob("boot/vmlinuz-*"))
    if not found or not BUSYBOX.exists():
        raise FileNotFoundError(f"the lab's netboot files are missing under {NETBOOT_ROOT}: "
                                "run `make setup`")
    version = found[-1].name.removeprefix("vmlinuz-")
    return Kernel(found[-1], NETBOOT_ROOT / "lib" / "modules" / version / "kernel")


def module_order(modules_dir: Path, wanted: tuple[str, ...] = MODULES) -> list[Path]:
    """The modules to load, dependencies first (each module's own `depends=`)."""
    files = {p.name.removesuffix(".ko").replace("-", "_"): p for p in modules_dir.rglob("*.ko")}
    ordered: list[Path] = []

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in chain:
            raise ValueError(f"module dependency cycle: {' -> '.join((*chain, name))}")
        path = files.get(name)
        if path is None:
            needed_by = chain[-1] if chain else "the installer"
            raise FileNotFoundError(f"kernel module {name} (needed by {needed_by}) is not "
                                    f"under {modules_dir}: run `make setup`")
        if path in ordered:
            return
        match = re.search(rb"depends=([\w,-]*)\0", path.read_bytes())
        for dep in filter(None, (match.group(1).decode() if match else "").split(",")):
            add(dep.replace("-", "_"), (*chain, name))
        ordered.append(path)

    for name in wanted:
        add(name, ())
    return ordered


def cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """An initramfs archive (cpio "newc", what the kernel unpacks): (path, mode, data) each;
    a mode with S_IFDIR is a directory, S_IFLNK a symlink to `data`."""
    out = io.BytesIO()

    def pad() -> None:
        out.write(b"\0" * (-out.tell() % 4))

    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + encoded)
        pad()
        out.write(data)
        pad()
    return out.getvalue()


def initramfs_entries(k: Kernel) -> list[tuple[str, int, bytes]]:
    dirs = ["bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules", "lib/installer",
            "lib/installer/shim"]
    entries: list[tuple[str, int, bytes]] = [(d, 0o40755, b"") for d in dirs]
    entries.append(("bin/busybox", 0o100755, BUSYBOX.read_bytes()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    modules = module_order(k.modules_dir)
    for module in modules:
        entries.append((f"lib/modules/{module.name}", 0o100644, module.read_bytes()))
    order = "".join(f"{m.name}\n" for m in modules).encode()
    entries.append(("lib/modules/order", 0o100644, order))
    entries.append(("lib/installer/bootsector.bin", 0o100644, BOOT_SECTOR))
    for source in sorted(INSTALLER_DIR.rglob("*")):
        if source.is_file():
            rel = source.relative_to(INSTALLER_DIR).as_posix()
            target = "init" if rel == "init" else f"lib/installer/{rel}"
            entries.append((target, 0o100755, source.read_bytes()))
    return entries


def build_initramfs(out_dir: Path) -> Path:
    """The installer's initrd in `out_dir`, rebuilt only when its inputs change."""
    entries = initramfs_entries(kernel())
    digest = hashlib.sha256()
    for name, mode, data in entries:
        digest.update(f"{name}\0{mode}\0{len(data)}\0".encode() + data)
    target = out_dir / f"installer-{digest.hexdigest()[:16]}.cpio.gz"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        # mtime 0: the same inputs give the same bytes
        tmp.write_bytes(gzip.compress(cpio_newc(entries), compresslevel=6, mtime=0))
        tmp.replace(target)
    return target


def read_install(disk: Path) -> dict[str, str] | None:
    """The files the installer wrote to a host's disk (path without the leading slash ->
    text), or None if the disk holds no install."""
    try:
        with disk.open("rb") as fh:
            if fh.read(512)[510:] != b"\x55\xaa":
                return None
            fh.seek(INSTALL_OFFSET)
            with tarfile.open(fileobj=fh, mode="r|") as tar:
                return {member.name.removeprefix("./"): extracted.read().decode()
                        for member in tar
                        if member.isfile() and (extracted := tar.extractfile(member))}
    except (OSError, tarfile.TarError):
        return None
