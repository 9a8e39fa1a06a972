"""The lab's store network: where the simulated store hosts and VMs live, apart from the
orchestrator's network.

A network namespace the lab makes holds a bridge (`BRIDGE`) with the gateway address
(`GATEWAY`) and nothing else: no uplink, no default route, no NAT, so nothing on it reaches
any outside network, and the host's own interfaces are never touched. Each simulated machine
gets a network namespace of its own, joined to the bridge by a veth pair, with an address the
lab assigns (`lab/host_namespace.py` sets that up before the machine's minion starts).
libvirtd runs on this network too (lab/libvirt_service.py), so a VM's NIC on `BRIDGE` is on
the store network as a store VM's NIC on `br0` is on the store's LAN; such a guest, and a
store host's PXE ROM and installer, get an address by DHCP from the dnsmasq Cobbler manages
on the bridge (lab/cobbler_dhcp.py: `DHCP_FIRST`..`DHCP_LAST`, no router or DNS offered).

The lab's services (Salt master, Cobbler's HTTP side, the image server, the hardware
simulator) listen on the orchestrator's loopback. The gateway process forwards their ports
from `GATEWAY` to them, like a router with port forwarding: a store host reaches them only by
that address, as a real store host reaches the data centre by the master's address.

Run (by `lab up`): python -m lab.store_network --state-file <file> --forward <port>...
The state file (pid, namespace inode) is written once the gateway listens; clients check
the inode before they enter the namespace, so a recycled PID never leads them elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import hashlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NETWORK = ipaddress.IPv4Network("10.77.0.0/16")
GATEWAY = "10.77.0.1"
BRIDGE = "storebr0"
FIRST_MACHINE = int(ipaddress.IPv4Address("10.77.1.1"))
# booted guests (the full lab's real VMs) lease from here; simulated machines stay below
DHCP_FIRST = "10.77.128.1"
DHCP_LAST = "10.77.255.254"
CLONE_NEWNET = 0x40000000
# a store's link state beside the gateway's state file (lab/wan.py); the gateway reads "delays"
LINKS_FILE = "links.json"
DELAY_LINE_PIECES = 64  # pieces of up to 256 KiB held per direction: backpressure past that


def machine_address(index: int) -> str:
    """The address of the index-th simulated machine (0-based), on NETWORK, never the gateway."""
    address = ipaddress.IPv4Address(FIRST_MACHINE + index)
    if address not in NETWORK or address >= ipaddress.IPv4Address(DHCP_FIRST):
        raise ValueError(f"the lab's store network {NETWORK} has no address for machine {index}")
    return str(address)


def link_name(machine_id: str) -> str:
    """The gateway-side veth of a machine: stable per machine (a restart replaces it), <= 15
    characters as the kernel requires."""
    return "vh" + hashlib.sha256(machine_id.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class StoreNetwork:
    """A running gateway, as its state file describes it."""

    pid: int
    netns_inode: int
    gateway: str
    prefix: int
    bridge: str
    forwarded: list[int]

    @classmethod
    def load(cls, state_file: Path) -> StoreNetwork:
        try:
            return cls(**json.loads(state_file.read_text()))
        except FileNotFoundError:
            raise RuntimeError(f"the lab's store network is not up ({state_file} missing): "
                               "run `store-rollout lab up`") from None

    def url(self, port: int) -> str:
        return f"http://{self.gateway}:{port}"

    def open_namespace(self) -> int:
        """An fd of the gateway's network namespace, checked to be the one it made."""
        try:
            fd = os.open(f"/proc/{self.pid}/ns/net", os.O_RDONLY)
        except FileNotFoundError:
            fd = -1
        if fd < 0 or os.fstat(fd).st_ino != self.netns_inode:
            if fd >= 0:
                os.close(fd)
            raise RuntimeError(f"the lab's store network gateway (pid {self.pid}) is gone: "
                               "run `store-rollout lab up`")
        return fd

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run a command on the store network, at the gateway (what a machine on the network
        sees: the forwarded services at GATEWAY, nothing of the orchestrator's loopback)."""
        fd = self.open_namespace()
        try:
            return subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", *argv],
                                  pass_fds=(fd,), **kwargs)
        finally:
            os.close(fd)

    def join_args(self, machine_id: str, address: str) -> list[str]:
        """`lab/host_namespace.py` options that put a machine on this network."""
        return ["--network-pid", str(self.pid), "--network-inode", str(self.netns_inode),
                "--bridge", self.bridge, "--link", link_name(machine_id),
                "--address", f"{address}/{self.prefix}"]


# -- the gateway process -----------------------------------------------------------------
def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: Callable[[], float] | None = None) -> None:
    """Copy one direction of a connection; with `delay`, each piece of data is held that long
    (seconds, drawn per piece; never reordered: a piece leaves no earlier than the one before)
    - a store's WAN delay (lab/wan.py), which this kernel's lack of netem leaves to here."""
    if delay is None:
        await _copy(reader, writer)
        return
    loop = asyncio.get_running_loop()
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=DELAY_LINE_PIECES)

    async def deliver() -> None:
        try:
            while (item := await line.get())[1]:
                if (wait := item[0] - loop.time()) > 0:
                    await asyncio.sleep(wait)
                writer.write(item[1])
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    sender, due = asyncio.create_task(deliver()), 0.0

    async def put(item: tuple[float, bytes]) -> bool:
        """Queue a piece unless the sender is gone (its writer failed): then nothing more."""
        putting = asyncio.ensure_future(line.put(item))
        await asyncio.wait({putting, sender}, return_when=asyncio.FIRST_COMPLETED)
        if not putting.done():
            putting.cancel()
        return not sender.done()

    try:
        while not sender.done():
            reading = asyncio.ensure_future(reader.read(256 * 1024))
            await asyncio.wait({reading, sender}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():  # the writer failed: stop reading, close
                reading.cancel()
                break
            if not (data := reading.result()):
                break
            due = max(due, loop.time() + delay())
            if not await put((due, data)):
                break
    except (ConnectionError, OSError):
        pass
    if not sender.done():
        await put((0.0, b""))
    await sender


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class LinkDelays:
    """Per machine address, the one-way delay of its store's link: half the profile's delay
    each way, jitter spread evenly around it (lab/wan.py writes `delays` into LINKS_FILE);
    the file is read again when it changes, at most once a second."""

    def __init__(self, path: Path) -> None:
        self.path, self.mtime, self.checked = path, 0.0, 0.0
        self.delays: dict[str, tuple[float, float]] = {}

    def of(self, address: str) -> Callable[[], float] | None:
        now = time.monotonic()
        if now - self.checked > 1.0:
            self.checked = now
            with contextlib.suppress(OSError, ValueError):
                mtime = self.path.stat().st_mtime
                if mtime != self.mtime:
                    raw = json.loads(self.path.read_text()).get("delays", {})
                    self.delays = {a: (d / 2000.0, j / 2000.0) for a, (d, j) in raw.items()}
                    self.mtime = mtime
        if address not in self.delays:
            return None
        base, jitter = self.delays[address]
        return lambda: max(0.0, base + random.uniform(-jitter, jitter))


async def _forward(listeners: list[socket.socket], host_namespace: int,
                   delays: LinkDelays) -> None:
    # Sockets keep the namespace they were made in. The gateway's main thread stays in the
    # store network (its /proc/<pid>/ns/net is what machines join); one worker thread moves
    # to the orchestrator's namespace and makes the upstream sockets there.
    upstream_maker = ThreadPoolExecutor(
        1, initializer=_libc_call, initargs=("setns", host_namespace, CLONE_NEWNET))
    loop = asyncio.get_running_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     port: int) -> None:
        upstream = await loop.run_in_executor(upstream_maker, socket.socket)
        upstream.setblocking(False)
        try:
            await loop.sock_connect(upstream, ("127.0.0.1", port))
        except OSError:
            upstream.close()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(sock=upstream)
        peer = writer.get_extra_info("peername")
        delay = delays.of(peer[0]) if peer else None
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay))
        for w in (writer, up_writer):
            with contextlib.suppress(OSError):
                w.close()

    def handler_for(port: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                           Awaitable[None]]:
        return lambda reader, writer: handle(reader, writer, port)

    for listener in listeners:
        await asyncio.start_server(handler_for(listener.getsockname()[1]), sock=listener)
    await asyncio.Event().wait()  # until SIGTERM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--forward", type=int, action="append", default=[],
                        help="a port of the orchestrator's loopback to offer at the gateway")
    args = parser.parse_args()
    host_namespace = os.open("/proc/self/ns/net", os.O_RDONLY)
    _libc_call("unshare", CLONE_NEWNET)
    if os.stat("/proc/self/ns/net").st_ino == os.fstat(host_namespace).st_ino:
        raise SystemExit("store network: unshare left the gateway in the host's namespace")
    for command in (["ip", "link", "set", "lo", "up"],
                    ["ip", "link", "add", BRIDGE, "type", "bridge"],
                    ["ip", "addr", "add", f"{GATEWAY}/{NETWORK.prefixlen}", "dev", BRIDGE],
                    ["ip", "link", "set", BRIDGE, "up"]):
        subprocess.run(command, check=True)
    listeners = []
    for port in args.forward:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((GATEWAY, port))
        listener.listen(128)
        listener.setblocking(False)
        listeners.append(listener)
    state = StoreNetwork(pid=os.getpid(), netns_inode=os.stat("/proc/self/ns/net").st_ino,
                         gateway=GATEWAY, prefix=NETWORK.prefixlen, bridge=BRIDGE,
                         forwarded=args.forward)
    tmp = args.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    tmp.replace(args.state_file)
    asyncio.run(_forward(listeners, host_namespace,
                         LinkDelays(args.state_file.parent / LINKS_FILE)))


if __name__ == "__main__":
    main()
