"""Start a simulated machine's process apart from the orchestrator: on the lab's store network
(its own network namespace, joined to the store network's bridge by a veth pair, with the
address the lab gave it) and, for a store host, in a mount namespace in which the lab's state
dir (the orchestrator's image cache, master config, lab.json, credentials) is not there: a
store host has none of it. Only what the host would have is bound back (its own disk, the
libvirt socket, the VM images dir that libvirtd shares with it; a box with a libvirtd of its own:
that libvirtd's socket and PKI dir, and its own images dir bound over the common images path).

Run under `unshare --net [--mount --propagation private]` (nothing reaches the host):
    python host_namespace.py [--network-pid P --network-inode I --bridge B --link L
                              --address A/N] [--hide <lab dir> --keep <path>...
                              --bind <source> <target>...] -- <command>...
Standard library only: it runs with the machine's Python (the Salt 3006 venv for hosts, Python
3.6 for a Leap 15.6 host's Salt 3006.0), so it stays 3.6 syntax (`make lint` checks).
"""

import argparse
import ctypes
import importlib.util
import os
import socket
import struct
import subprocess
from typing import List, Tuple

MS_BIND = 4096


def join_network(args: argparse.Namespace) -> None:
    # refuse anything but a fresh namespace: a veth added here must never land on the host
    if [name for _index, name in socket.if_nameindex()] != ["lo"]:
        raise SystemExit("host_namespace: not in a new network namespace (run under "
                         "`unshare --net`); refusing to add interfaces")
    gateway = os.open(f"/proc/{args.network_pid}/ns/net", os.O_RDONLY)
    if os.fstat(gateway).st_ino != args.network_inode:
        raise SystemExit(f"host_namespace: the store network gateway (pid {args.network_pid}) "
                         "is gone: run `store-rollout lab up`")
    at_gateway = ["nsenter", f"--net=/proc/self/fd/{gateway}"]

    def run(argv: List[str], check: bool = True) -> None:
        subprocess.run(argv, check=check, pass_fds=(gateway,),
                       stderr=None if check else subprocess.DEVNULL)

    run([*at_gateway, "ip", "link", "del", args.link], check=False)  # left by a crash
    run([*at_gateway, "ip", "link", "add", args.link, "type", "veth",
         "peer", "name", "eth0", "netns", str(os.getpid())])
    run([*at_gateway, "ip", "link", "set", args.link, "master", args.bridge, "up"])
    run(["ip", "addr", "add", args.address, "dev", "eth0"])
    run(["ip", "link", "set", "eth0", "up"])
    run(["ip", "link", "set", "lo", "up"])
    # the store's WAN rates (lab/wan.py): what the machine downloads leaves the gateway's end
    # of the veth, what it uploads leaves its own; the kernel's tbf, in the lab's namespaces only
    if args.down_tbf:
        run([*at_gateway, "tc", "qdisc", "replace", "dev", args.link, "root", *args.down_tbf.split()])
    if args.up_tbf:
        run(["tc", "qdisc", "replace", "dev", "eth0", "root", *args.up_tbf.split()])
    os.close(gateway)


def bind_plan(keep: List[str], binds: List[List[str]]) -> List[Tuple[str, str]]:
    """(source, target) of each bind made after the lab dir is hidden: a kept path over itself,
    then each `--bind SOURCE TARGET` (a box's own images dir over the lab's common VM images
    path); a target given twice is refused (the later bind would cover the earlier one)."""
    plan = [(path, path) for path in keep] + [(src, dst) for src, dst in binds]
    targets = [os.path.normpath(dst) for _src, dst in plan]
    doubled = sorted({t for t in targets if targets.count(t) > 1})
    if doubled:
        raise SystemExit("host_namespace: bound twice: {}".format(", ".join(doubled)))
    return plan


def hide(lab_dir: str, keep: List[str], binds: List[List[str]]) -> None:
    # hold the sources open: after the tmpfs covers their path, /proc/self/fd/N still reaches
    # them and the kernel binds them (a path string would name the empty tmpfs)
    plan = bind_plan(keep, binds)
    kept = [(os.open(src, os.O_PATH | os.O_DIRECTORY), dst) for src, dst in plan]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "store-host-hidden",
                    lab_dir], check=True)
    libc = ctypes.CDLL(None, use_errno=True)
    for fd, path in kept:
        os.makedirs(path, exist_ok=True)
        if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"bind {path}: {os.strerror(errno)}")
        os.close(fd)


def smbios_tables(serial: str) -> Tuple[bytes, bytes]:
    """An SMBIOS 3.0 entry point and a structure table holding the machine's System Information
    (type 1: maker, product, version, serial), as the kernel exports the firmware's."""
    strings = ["store-rollout lab", "store host", "1", serial]
    system = struct.pack("<BBHBBBB16sBBB", 1, 0x1B, 0x0100, 1, 2, 3, 4, bytes(16), 6, 0, 0)
    table = system + b"\0".join(s.encode() for s in strings) + b"\0\0"
    table += struct.pack("<BBH", 127, 4, 0xFEFF) + b"\0\0"  # end of table
    entry = bytearray(struct.pack("<5sBBBBBBBIQ", b"_SM3_", 0, 0x18, 3, 0, 0, 1, 0, len(table), 0))
    entry[5] = -sum(entry) & 0xFF  # the entry point's bytes sum to zero
    return bytes(entry), table


def serve_smbios(serial: str) -> None:
    """The machine's firmware tables where Linux shows them (/sys/firmware/dmi/tables, read by
    dmidecode, which Salt's core grains run when there is no /sys/class/dmi/id); a host whose
    kernel also has /sys/class/dmi/id gets the serial there, which Salt reads first."""
    entry, table = smbios_tables(serial)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=64k", "smbios", "/sys/firmware"],
                   check=True)
    os.makedirs("/sys/firmware/dmi/tables")
    for name, data in (("smbios_entry_point", entry), ("DMI", table)):
        with open(os.path.join("/sys/firmware/dmi/tables", name), "wb") as out:
            out.write(data)
    dmi_id = "/sys/devices/virtual/dmi/id"
    if os.path.isdir(dmi_id):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=64k", "smbios-id", dmi_id],
                       check=True)
        with open(os.path.join(dmi_id, "product_serial"), "w") as out:
            out.write(serial + "\n")


def boot_units(root: str, start: bool, whole_boot: bool = False) -> None:
    """The machine's init for its systemd units (the lab's `service` module: the same code
    the minion's service.start runs), on the machine's network, before its minion starts."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "salt_overlay", "_modules",
                        "lab_service.py")
    spec = importlib.util.spec_from_file_location("lab_service", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"host_namespace: cannot load {path}")
    units = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(units)
    # _boot: private to Salt's loader (not a `service.*` function), this init's own entry
    for unit, runs in units._boot(root, start, whole_boot).items():
        print("host_namespace: unit {} {}".format(unit, "started" if runs else "failed to start"),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--network-pid", type=int, help="the store network gateway's pid")
    parser.add_argument("--network-inode", type=int, help="its network namespace's inode")
    parser.add_argument("--bridge", help="the store network's bridge (in the gateway's namespace)")
    parser.add_argument("--link", help="name of the gateway-side veth")
    parser.add_argument("--address", help="this machine's address/prefix")
    parser.add_argument("--down-tbf", help="tbf arguments of the gateway's end (the store's "
                        "download rate, lab/wan.py)")
    parser.add_argument("--up-tbf", help="tbf arguments of the machine's end (its upload rate)")
    parser.add_argument("--hide", help="directory to replace by an empty tmpfs")
    parser.add_argument("--keep", action="append", default=[], help="path under it to keep")
    parser.add_argument("--bind", action="append", default=[], nargs=2,
                        metavar=("SOURCE", "TARGET"),
                        help="after hiding: bind directory SOURCE over TARGET (a box's own "
                             "images dir over the common VM images path)")
    parser.add_argument("--boot-root", help="the machine's root: start its enabled units")
    parser.add_argument("--smbios-serial", help="the serial the machine's firmware reports")
    parser.add_argument("--units-fail", action="store_true",
                        help="its enabled units fail to start at this boot (a lab fault)")
    parser.add_argument("--units-fail-whole-boot", action="store_true",
                        help="and every later start in this boot fails too")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if args.network_pid is not None:
        join_network(args)
    if args.hide:
        hide(args.hide, args.keep, args.bind)
    if args.smbios_serial:
        serve_smbios(args.smbios_serial)
    if args.boot_root:
        boot_units(args.boot_root, start=not args.units_fail,
                   whole_boot=args.units_fail_whole_boot)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
