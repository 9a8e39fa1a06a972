"""A store's WAN link in the lab: a profile (rate, delay, loss) per store, and a cut on command.

A real store sits behind DSL, LTE or a satellite link; the lab's store network is a bridge. This
module gives each store's machines (its host's and its VM's minion, each in a network namespace
of its own, joined to the store network by a veth: lab/store_network.py) the link of a profile,
always inside the lab's own namespaces, never on the host's interfaces.

This machine's kernel has no `netem` (nor fq, sfq, cake or tc filters); it has `tbf`, `htb`
and iptables with the `statistic` match. So each property is made where it can be, for real:

- **rate**: the kernel's `tbf` on both ends of the machine's veth: the gateway's end (what the
  machine downloads) and the machine's own `eth0` (what it uploads);
- **loss**: iptables in the gateway's namespace drops that share of the machine's packets, at
  random, both ways (`-m statistic --mode random`): TCP retransmits as over a lossy link;
- **delay** (with jitter): the gateway's forwarder (lab/store_network.py), which every store
  machine's connection to the lab's services passes, holds each piece of data that long in each
  direction (half the profile's delay each way, order kept);
- **cut**: iptables drops everything of the store's machines, both ways, silently (no reset,
  no carrier loss on the store's side), as a WAN link that fails upstream of the store's router.
  TCP connections stay open and resume when the link comes back.

Limits: each machine of the store gets the profile's full rate (a store's host and VM do not
share one link); the delay applies to traffic through the gateway (the lab's services), not to
DHCP/TFTP on the bridge. A box with a libvirtd of its own (lab/boxes.py) is not shaped.

State: `links.json` beside the gateway's state file: per store its profile and cut, plus, per
machine address, the delay the gateway applies. Kept across machine restarts: a machine's
shaping is applied again each time it joins the network (lab/host_namespace.py's --down-tbf,
--up-tbf).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.state import LabInfo, LabPaths
from lab.store_network import LINKS_FILE, StoreNetwork, link_name

CHAIN_IN, CHAIN_OUT = "LAB_WAN_IN", "LAB_WAN_OUT"
MACHINE_IFACE = "eth0"  # the machine's end of its veth (lab/host_namespace.py)
MACHINE_ID = re.compile(r"^store-(?P<store>[a-z0-9][a-z0-9-]*?)-(?:vm|hv(?:-[0-9a-f]{6})?)$")


@dataclass(frozen=True)
class LinkProfile:
    """A WAN link: rates in kbit/s, delay (round trip added) and jitter in ms, loss in %."""

    name: str
    down_kbit: int
    up_kbit: int
    delay_ms: int
    jitter_ms: int
    loss_pct: float

    @property
    def shaped(self) -> bool:
        return self.down_kbit > 0


PROFILES: dict[str, LinkProfile] = {p.name: p for p in (
    LinkProfile("lan", 0, 0, 0, 0, 0.0),
    LinkProfile("dsl", 16_000, 1_000, 30, 0, 0.1),
    LinkProfile("lte", 10_000, 2_000, 60, 20, 1.0),
    LinkProfile("satellite", 10_000, 1_000, 600, 0, 0.5),
)}


def profile(name: str) -> LinkProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"link profile {name!r}: use one of {', '.join(PROFILES)}") from None


def tbf_args(kbit: int) -> list[str]:
    """`tc qdisc replace ... root` arguments of a rate of `kbit`: a bucket of at least 2 ms of
    the rate (and 16 KiB), a queue of 300 ms; 0 means no shaping (the default qdisc)."""
    burst = max(16 * 1024, kbit * 1000 // 8 // 500)
    return ["tbf", "rate", f"{kbit}kbit", "burst", str(burst), "latency", "300ms"]


def drop_rules(address: str, loss_pct: float, cut: bool) -> list[list[str]]:
    """The iptables rules (chain, match...) that make a machine's loss or cut at the gateway."""
    if cut:
        match: list[str] = []
    elif loss_pct > 0:
        match = ["-m", "statistic", "--mode", "random", "--probability", f"{loss_pct / 100:.6f}"]
    else:
        return []
    return [[CHAIN_IN, "-s", address, *match, "-j", "DROP"],
            [CHAIN_OUT, "-d", address, *match, "-j", "DROP"]]


def store_of(machine_id: str) -> str | None:
    """The store a machine belongs to: `store-<id>-hv`, `store-<id>-hv-<6 hex>` (a refreshed
    box), `store-<id>-vm`; matched at the end only (a store id may hold "-vm" or "-hv")."""
    match = MACHINE_ID.match(machine_id)
    return match.group("store") if match else None


# -- the state ---------------------------------------------------------------------------
def _links_path(info: LabInfo) -> Path:
    return Path(info.store_network_state).parent / LINKS_FILE


def _load(info: LabInfo) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(_links_path(info).read_text())
    except FileNotFoundError:
        data = {}
    data.setdefault("stores", {})
    return data


def _machines(info: LabInfo, store_id: str) -> dict[str, str]:
    """machine id -> address, of the store's machines the simulator has given an address."""
    from lab.store_network import machine_address

    book = LabPaths(Path(info.state_dir)).machine_addresses
    assigned: dict[str, int] = json.loads(book.read_text()) if book.exists() else {}
    return {m: machine_address(i) for m, i in assigned.items() if store_of(m) == store_id}


def _save(info: LabInfo, data: dict[str, Any]) -> None:
    delays: dict[str, list[int]] = {}
    for store_id, link in data["stores"].items():
        p = profile(link["profile"])
        if p.delay_ms:
            for address in _machines(info, store_id).values():
                delays[address] = [p.delay_ms, p.jitter_ms]
    data["delays"] = delays
    path = _links_path(info)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def store_link(info: LabInfo, store_id: str) -> dict[str, Any]:
    """{"profile", "cut", "cut_since", "machines"} of a store (profile `lan` when never set)."""
    link = _load(info)["stores"].get(store_id, {"profile": "lan", "cut": False})
    return {"profile": link["profile"], "cut": bool(link.get("cut")),
            "cut_since": link.get("cut_since"), "machines": sorted(_machines(info, store_id))}


def cut_links(info: LabInfo) -> list[str]:
    """The stores whose link is cut now (lab/faults.py counts them as knobs left set)."""
    return sorted(s for s, link in _load(info)["stores"].items() if link.get("cut"))


@contextmanager
def _changing(info: LabInfo) -> Iterator[dict[str, Any]]:
    """The state, to change: read, changed by the caller, saved and applied under one lock (a
    machine's start in the simulator beside a `lab link --cut` must not write back the old
    state, nor rebuild the drop rules from it)."""
    lock = _links_path(info).with_suffix(".lock")
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        data = _load(info)
        yield data
        _save(info, data)
        _apply_drops(info, data)


def machine_link(info: LabInfo, machine_id: str) -> LinkProfile:
    """The profile of a machine's store, for its (re)start: the state file brought up to date
    with its address (the gateway's delay) and the drop rules applied first."""
    store_id = store_of(machine_id)
    if store_id is None or store_id not in _load(info)["stores"]:
        return PROFILES["lan"]
    with _changing(info) as data:
        name = data["stores"][store_id]["profile"]
    return profile(name)


def set_store_link(info: LabInfo, store_id: str, profile_name: str) -> dict[str, Any]:
    """Give a store's link a profile: persisted, applied to its running machines at once and to
    each machine at its every (re)start."""
    p = profile(profile_name)
    with _changing(info) as data:
        data["stores"].setdefault(store_id, {"cut": False})["profile"] = p.name
    for machine_id in _machines(info, store_id):
        _shape_running(info, machine_id, p)
    return store_link(info, store_id)


def cut_store_link(info: LabInfo, store_id: str) -> dict[str, Any]:
    """The fault knob: everything of the store's machines dropped both ways, until restored."""
    with _changing(info) as data:
        link = data["stores"].setdefault(store_id, {"profile": "lan"})
        if not link.get("cut"):
            link["cut"], link["cut_since"] = True, time.time()
    return store_link(info, store_id)


def restore_store_link(info: LabInfo, store_id: str) -> dict[str, Any]:
    with _changing(info) as data:
        link = data["stores"].setdefault(store_id, {"profile": "lan"})
        link["cut"], link["cut_since"] = False, None
    return store_link(info, store_id)


# -- applying it, inside the lab's namespaces only ----------------------------------------
def _iptables() -> str:
    # the legacy backend: the kernel's nf_tables would do too, but Debian's iptables-nft needs
    # nothing more and iptables-legacy is what this kernel offers without modules
    return shutil.which("iptables-legacy") or "iptables"


def _apply_drops(info: LabInfo, data: dict[str, Any]) -> None:
    """The gateway's LAB_WAN chains rebuilt from the state (idempotent): every store's cut or
    loss, by its machines' addresses."""
    network = StoreNetwork.load(Path(info.store_network_state))
    ipt = _iptables()

    def run(*args: str, check: bool = True) -> bool:
        done = network.run([ipt, "-w", *args], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"lab WAN: {' '.join(args)}: {done.stderr.strip()}")
        return done.returncode == 0

    for chain, hook in ((CHAIN_IN, "INPUT"), (CHAIN_OUT, "OUTPUT")):
        run("-N", chain, check=False)
        run("-F", chain)
        if not run("-C", hook, "-j", chain, check=False):
            run("-I", hook, "-j", chain)
    for store_id, link in data["stores"].items():
        p = profile(link["profile"])
        for address in _machines(info, store_id).values():
            for rule in drop_rules(address, p.loss_pct, bool(link.get("cut"))):
                run("-A", *rule)


def _machine_pid(info: LabInfo, machine_id: str) -> int | None:
    record = Path(info.state_dir) / "simulator" / "minions" / machine_id / "process.json"
    try:
        pid = int(json.loads(record.read_text())["pid"])
    except (FileNotFoundError, KeyError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


def _shape_running(info: LabInfo, machine_id: str, p: LinkProfile) -> None:
    """A running machine's rates now: the gateway's end of its veth, then its own eth0 (through
    its minion's network namespace); a machine not running gets them when it starts."""
    network = StoreNetwork.load(Path(info.store_network_state))
    link = link_name(machine_id)
    if network.run(["ip", "link", "show", link], capture_output=True).returncode != 0:
        return
    down = (["replace", "dev", link, "root", *tbf_args(p.down_kbit)] if p.shaped
            else ["del", "dev", link, "root"])
    network.run(["tc", "qdisc", *down], capture_output=True)
    pid = _machine_pid(info, machine_id)
    if pid is not None:
        up = (["replace", "dev", MACHINE_IFACE, "root", *tbf_args(p.up_kbit)] if p.shaped
              else ["del", "dev", MACHINE_IFACE, "root"])
        subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "tc", "qdisc", *up],
                       capture_output=True)


def join_options(info: LabInfo, machine_id: str) -> list[str]:
    """lab/host_namespace.py options that shape a machine's veth as it joins the network."""
    p = machine_link(info, machine_id)
    if not p.shaped:
        return []
    return [f"--down-tbf={' '.join(tbf_args(p.down_kbit))}",
            f"--up-tbf={' '.join(tbf_args(p.up_kbit))}"]


def describe(link: dict[str, Any]) -> str:
    p = profile(link["profile"])
    rate = (f"{p.down_kbit / 1000:g}/{p.up_kbit / 1000:g} Mbit/s, {p.delay_ms} ms"
            f"{f' ± {p.jitter_ms} ms' if p.jitter_ms else ''}, {p.loss_pct:g} % loss"
            if p.shaped else "no shaping")
    state = (f"CUT since {time.strftime('%H:%M:%S', time.gmtime(link['cut_since']))} UTC"
             if link["cut"] else "up")
    return f"{link['profile']} ({rate}), {state}"
