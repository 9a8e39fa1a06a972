"""Store hardware simulator: the only simulated part of the lab.

- PXE + install: Cobbler's `lab` fence agent POSTs power actions here. On power on/reboot the
  "machine" does what its firmware would: read the PXE config Cobbler synced for its MAC; if it
  points at an AutoYaST profile, fetch it from Cobbler, lay down the files it writes, start the
  hypervisor's salt-minion from them and call Cobbler's end-of-install (nopxe) URL; if it says
  localboot, boot the installed system.
- VM boot: a libvirt lifecycle callback (not polling) starts a salt-minion for each started
  domain, with the minion.d files of the image the domain's disk is backed by. A domain
  whose disk holds a built image (the full lab) is left alone: QEMU boots it for real. The identity
  comes the way the guest gets it: the image's own store-identity script reads the domain's
  STORE_SEED seed disk (its CD-ROM's ISO file, as the guest would see it); a disk that booted
  before keeps the identity it was given. Stopping the domain stops that minion.
- Reboot: the `provisioning.reboot` Salt module asks for a reboot here; the simulator restarts
  that minion process (never the host).
- Network: every machine's minion runs in a network namespace of its own on the lab's store
  network (lab/store_network.py), with an address the simulator assigns and keeps per
  machine; the firmware's downloads (profile, nopxe) go over that network too. Store hosts
  also get a mount namespace without the lab's state (lab/host_namespace.py).
- Fault knobs per step (`pxe`, `startup_highstate`, `vm_boot`, `reboot`, `vm_start`): delay, fail
  the next N times, never; `GET /faults/taken` counts the delays and failures they caused.

Run: python -m lab.simulator --state-dir <lab>
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hmac
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from lab.autoyast import parse_autoyast
from lab.jsonhttp import JsonHandler
from lab.procs import ProcessRecord, spawn, stop
from lab.state import HOST_PY36_SALT_BIN, HOST_SALT_BIN, REPO_ROOT, VENV_BIN, LabInfo, LabPaths
from lab.store_network import StoreNetwork, machine_address
from store_rollout.contracts import (
    IDENTITY_SALT_DIR_ENV,
    IDENTITY_SEED_DIR_ENV,
    SEED_LABEL,
    SEED_METADATA_NS,
)

log = logging.getLogger("lab.simulator")

# old_host_salt: the next installed host runs Leap 15.6's stock Salt 3006.0 on Python 3.6
STEPS = ("pxe", "startup_highstate", "vm_boot", "reboot", "vm_start", "old_host_salt")
# a Leap host's salt-minion extension modules (its extension_modules default)
HOST_EXTMODS = "/var/cache/salt/minion/extmods/"


# what the installer's curl does; run on the store network (StoreNetwork.run)
_FETCH = ("import sys, urllib.request\n"
          "with urllib.request.urlopen(sys.argv[1], timeout=30) as r:\n"
          "    sys.stdout.write(r.read().decode())")


class FaultKnobs:
    """Per-step faults: {"delay": s, "fail": n, "never": bool}; `fail` counts down per use.

    `taken` counts what the knobs really did (delays applied, failures caused), so a test can
    show its fault happened instead of assuming it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.knobs: dict[str, dict[str, Any]] = {}
        self.taken: dict[str, dict[str, int]] = {}

    def set(self, step: str, knob: dict[str, Any]) -> None:
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r}; choose one of {', '.join(STEPS)}")
        with self.lock:
            self.knobs[step] = {"delay": float(knob.get("delay", 0)),
                                "fail": int(knob.get("fail", 0)),
                                "never": bool(knob.get("never", False))}

    def clear(self, step: str | None = None) -> None:
        with self.lock:
            if step is None:
                self.knobs.clear()
                self.taken.clear()
            else:
                self.knobs.pop(step, None)
                self.taken.pop(step, None)

    def take(self, step: str) -> tuple[float, bool]:
        """(delay, fails_now) for one use of `step`."""
        with self.lock:
            knob = self.knobs.get(step)
            if not knob:
                return 0.0, False
            fails = knob["never"] or knob["fail"] > 0
            if fails and not knob["never"]:
                knob["fail"] -= 1
            counts = self.taken.setdefault(step, {"delayed": 0, "failed": 0})
            counts["delayed"] += knob["delay"] > 0
            counts["failed"] += fails
            return knob["delay"], fails

    def taken_snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return json.loads(json.dumps(self.taken))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return json.loads(json.dumps(self.knobs))


UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
SALT_LONGEST_SOCKET_NAME = "minion_event_0123456789_pull.ipc"  # salt: sha256(id)[:10]


def minion_root_dir(simulator_dir: Path, machine_index: int) -> Path:
    """A simulated machine's minion root_dir (pki, cache, sockets, pid, log): short and named
    by the machine's number, because Salt puts its event sockets under root_dir and a socket
    path longer than the kernel's limit kills the minion at start ("AF_UNIX path too long":
    CI's checkout path plus a long store id did)."""
    root = simulator_dir / "roots" / str(machine_index)
    longest = len(str(root / "sock" / SALT_LONGEST_SOCKET_NAME))
    if longest > UNIX_PATH_MAX:
        raise ValueError(
            f"lab state dir {simulator_dir.parent} is too deep: a minion's event socket there "
            f"would be {longest} characters long, the kernel allows {UNIX_PATH_MAX}; "
            "use a shorter --state-dir")
    return root


class MinionManager:
    """salt-minion processes for simulated machines, each with a private config and root dir."""

    def __init__(self, paths: LabPaths, info: LabInfo) -> None:
        self.paths = paths
        self.base = paths.simulator / "minions"
        self.base.mkdir(parents=True, exist_ok=True)
        self.logs = paths.logs
        self.info = info
        # the process table, history and address book; held only for quick bookkeeping
        self.lock = threading.RLock()
        # one per machine: a machine's power actions happen in order, and one machine's
        # power-off (up to a few seconds) never holds up another's (ten VMs rebooting at once)
        self.machine_locks: dict[str, threading.RLock] = {}
        self.procs: dict[str, ProcessRecord] = {}
        self.history: list[dict[str, Any]] = []

    def machine_lock(self, minion_id: str) -> threading.RLock:
        with self.lock:
            return self.machine_locks.setdefault(minion_id, threading.RLock())

    def minion_dir(self, minion_id: str) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", minion_id):
            raise ValueError(f"refusing odd minion id {minion_id!r}")
        return self.base / minion_id

    def install(self, minion_id: str, files: dict[str, str], extra: dict[str, Any],
                salt_bin: Path = VENV_BIN, store_host: bool = False,
                disk_files: dict[str, str] | None = None) -> Path:
        """Lay down a fresh system disk: config dir with the given minion.d files, and the Salt
        installed on it (`salt_bin`: the bin dir of that Salt's venv); `disk_files`: other files
        by their absolute path on a real machine, under the machine's root_dir (its "/")."""
        if not (salt_bin / "salt-minion").exists():
            raise FileNotFoundError(f"{salt_bin / 'salt-minion'} missing: run `make setup`")
        with self.machine_lock(minion_id):
            self.stop(minion_id)
            mdir = self.minion_dir(minion_id)
            if mdir.exists():
                shutil.rmtree(mdir)  # a reinstall wipes the disk, keys and grains included
            conf = mdir / "etc"
            (conf / "minion.d").mkdir(parents=True)
            root = self.root_dir(minion_id)
            shutil.rmtree(root, ignore_errors=True)  # keys, grains and cache go with the disk
            root.mkdir(parents=True)
            for name, text in files.items():
                (conf / "minion.d" / name).write_text(text)
            for path, text in (disk_files or {}).items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            self._write_hardware_config(minion_id, root, extra)
            (mdir / "salt-bin").write_text(str(salt_bin))
            if store_host:
                (mdir / "store-host").write_text("runs in a mount namespace without the lab\n")
            return mdir

    def _write_hardware_config(self, minion_id: str, root: Path, extra: dict[str, Any]) -> None:
        """`root`: the machine's disk, root_dir() (short, by machine number: Salt puts the
        event sockets under root_dir and their path must fit the kernel's limit)."""
        mdir = self.minion_dir(minion_id)
        hardware = {
            # what differs between a lab process and a real machine: paths, ports, virt URI
            "id": minion_id,
            "user": "root",
            "root_dir": str(root),
            "pki_dir": str(root / "pki"),
            "cachedir": str(root / "cache"),
            "sock_dir": str(root / "sock"),
            "pidfile": str(root / "salt-minion.pid"),
            "log_file": str(root / "minion.log"),
            "master_port": self.info.salt_ret_port,
            "publish_port": self.info.salt_publish_port,
            "acceptance_wait_time": 1,
            "acceptance_wait_time_max": 2,
            "random_reauth_delay": 0,
            "auth_timeout": 5,
            "multiprocessing": False,
            # the hardware's API (reboots), as a machine on the store network reaches it
            "store_rollout_lab": {"simulator_url": self.network().url(self.simulator_port)},
            **extra,
        }
        (mdir / "etc" / "minion.d" / "zz-lab-hardware.conf").write_text(yaml.safe_dump(hardware))
        # main config is loaded before minion.d, so keep it minimal
        (mdir / "etc" / "minion").write_text(f"id: {minion_id}\n")

    @property
    def simulator_port(self) -> int:
        return int(urlparse(self.info.simulator_url).port or 80)

    def network(self) -> StoreNetwork:
        """Read at each use: a restarted gateway has a new pid and namespace."""
        return StoreNetwork.load(Path(self.info.store_network_state))

    def address(self, machine_id: str) -> str:
        """The machine's address on the store network: assigned once, kept across reboots,
        reinstalls and simulator restarts (as a DHCP reservation would)."""
        return machine_address(self.machine_index(machine_id))

    def machine_index(self, machine_id: str) -> int:
        """The machine's number in the lab, assigned at its first use and kept."""
        book = self.paths.machine_addresses
        with self.lock:
            assigned: dict[str, int] = json.loads(book.read_text()) if book.exists() else {}
            if machine_id not in assigned:
                assigned[machine_id] = max(assigned.values(), default=-1) + 1
                tmp = book.with_suffix(".tmp")
                tmp.write_text(json.dumps(assigned, indent=1, sort_keys=True))
                tmp.replace(book)
            return assigned[machine_id]

    def root_dir(self, machine_id: str) -> Path:
        return minion_root_dir(self.paths.simulator, self.machine_index(machine_id))

    def installed(self, minion_id: str) -> bool:
        return (self.minion_dir(minion_id) / "etc" / "minion").exists()

    def start(self, minion_id: str, reason: str) -> None:
        with self.machine_lock(minion_id):
            with self.lock:
                current = self.procs.get(minion_id)
            if current and current.alive():
                return
            mdir = self.minion_dir(minion_id)
            marker = mdir / "salt-bin"  # absent in a lab state dir from before it existed
            salt_bin = Path(marker.read_text()) if marker.exists() else VENV_BIN
            argv = [str(salt_bin / "salt-minion"), "-c", str(mdir / "etc"), "-l", "warning"]
            argv = self._apart(minion_id, mdir, salt_bin, argv)
            record = spawn(
                argv,
                self.logs / f"minion-{minion_id}.log",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONWARNINGS": "ignore",
                     "STORE_ROLLOUT_LAB": "1"},
            )
            with self.lock:
                self.procs[minion_id] = record
                self.history.append({"minion": minion_id, "event": "start", "reason": reason,
                                     "pid": record.pid, "at": time.time()})
            (mdir / "process.json").write_text(json.dumps(record.to_json()))
            log.info("started minion %s (pid %s): %s", minion_id, record.pid, reason)

    def _apart(self, minion_id: str, mdir: Path, salt_bin: Path, argv: list[str]) -> list[str]:
        """Every machine on the store network in a network namespace of its own; a store host
        also in a mount namespace that has none of the lab's state (the orchestrator's image
        cache, master config, lab.json): only its own disk, the libvirt socket and the VM
        images dir."""
        options = self.network().join_args(minion_id, self.address(minion_id))
        unshare = ["unshare", "--net"]
        if (mdir / "store-host").exists():
            socket = parse_qs(urlparse(self.info.libvirt_uri).query)["socket"][0]
            keep = [mdir, self.root_dir(minion_id), Path(socket).parent,
                    Path(self.info.vm_images_dir)]
            unshare += ["--mount", "--propagation", "private"]
            options += ["--hide", str(self.paths.root), *[f"--keep={path}" for path in keep]]
        return [*unshare, "--", str(salt_bin / "python"),
                str(REPO_ROOT / "lab" / "host_namespace.py"), *options, "--", *argv]

    def stop(self, minion_id: str, reason: str = "", grace: float = 1.0) -> None:
        with self.machine_lock(minion_id):
            with self.lock:
                record = self.procs.pop(minion_id, None)
            if record is None:
                pfile = self.minion_dir(minion_id) / "process.json"
                if pfile.exists():
                    record = ProcessRecord.from_json(json.loads(pfile.read_text()))
            if record is not None:
                stop(record, grace=grace)
                with self.lock:
                    self.history.append({"minion": minion_id, "event": "stop",
                                         "reason": reason, "at": time.time()})

    def stop_all(self) -> None:
        with self.lock:
            running = list(self.procs)
        for minion_id in running:
            self.stop(minion_id, "simulator shutdown")

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {mid: {"pid": rec.pid, "alive": rec.alive()} for mid, rec in self.procs.items()}


class Simulator:
    def __init__(self, paths: LabPaths) -> None:
        info = paths.load_info()
        if info is None:
            raise SystemExit("simulator: lab.json missing")
        self.paths = paths
        self.info = info
        self.faults = FaultKnobs()
        self.minions = MinionManager(paths, info)
        self.cobbler_state = paths.cobbler
        self.domain_minions: dict[str, str] = {}
        self.stopping = threading.Event()
        self.power: dict[str, str] = {}

    # -- PXE + install ------------------------------------------------------------------
    def bmc_login_ok(self, authorization: str | None) -> bool:
        """The simulated BMCs take the lab's BMC login only (sent by Cobbler's fence agent)."""
        expected = f"{self.info.power_user}:{self.info.power_password}".encode()
        given = (authorization or "").removeprefix("Basic ").encode()
        return hmac.compare_digest(given, base64.b64encode(expected))

    def power_action(self, action: str, plug: str) -> dict[str, Any]:
        action = action.lower()
        if action in ("status", "monitor", "list"):
            state = "on" if self.power.get(plug) == "on" else "off"
            return {"plug": plug, "state": state}
        if action == "off":
            self.power[plug] = "off"
            self._stop_system(plug)
            return {"plug": plug, "state": "off"}
        if action in ("on", "reboot", "cycle"):
            self.power[plug] = "on"
            threading.Thread(target=self._boot_system, args=(plug,), daemon=True,
                             name=f"boot-{plug}").start()
            return {"plug": plug, "state": "on", "booting": True}
        raise ValueError(f"unsupported power action {action!r}")

    def _cobbler(self) -> Any:
        import xmlrpc.client

        return xmlrpc.client.ServerProxy(self.info.cobbler_url, allow_none=True)

    def _system_minion(self, system_name: str) -> str | None:
        marker = self.paths.simulator / "systems" / f"{system_name}.minion"
        return marker.read_text().strip() if marker.exists() else None

    def _stop_system(self, system_name: str) -> None:
        """Power off: the host's OS stops at once, its minion and its store's domains with it."""
        minion_id = self._system_minion(system_name)
        if minion_id:
            self.minions.stop(minion_id, f"power off {system_name}", grace=0.0)
        for dom in self._host_domains(system_name, active=True):
            with contextlib.suppress(Exception):  # gone meanwhile: nothing left to stop
                dom.destroy()
                log.info("power off %s: its domain %s stops", system_name, dom.name())

    def _host_domains(self, system_name: str, active: bool) -> list[Any]:
        """The domains that run on this store host (the lab's one libvirtd holds every host's):
        those seeded with its store's identity."""
        import libvirt

        marker = self.paths.simulator / "systems" / f"{system_name}.store"
        if not marker.exists():
            return []
        store_id = marker.read_text().strip()
        flag = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE if active else 0
        conn = libvirt.open(self.info.libvirt_uri)
        mine = []
        for dom in conn.listAllDomains(flag):
            with contextlib.suppress(libvirt.libvirtError, ET.ParseError):
                seed = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).find(
                    f"./metadata/{{{SEED_METADATA_NS}}}seed")
                if seed is not None and seed.get("store_id") == store_id:
                    mine.append(dom)
        return mine

    def _autostart_domains(self, system_name: str) -> None:
        """What the host's libvirt does at boot: start its domains marked autostart."""
        for dom in self._host_domains(system_name, active=False):
            with contextlib.suppress(Exception):
                if dom.autostart() and not dom.isActive():
                    dom.create()
                    log.info("%s boots: autostart domain %s started", system_name, dom.name())

    def _pxe_config(self, mac: str) -> str | None:
        name = "01-" + mac.lower().replace(":", "-")
        path = self.cobbler_state / "srv" / "u" / "tftpboot" / "pxelinux.cfg" / name
        return path.read_text() if path.exists() else None

    def _boot_system(self, system_name: str) -> None:
        try:
            self._stop_system(system_name)  # a power cycle kills the running OS
            system = self._cobbler().get_system(system_name)
            if not isinstance(system, dict):
                log.warning("power on %s: unknown to Cobbler, nothing boots", system_name)
                return
            macs = [i.get("mac_address") for i in system.get("interfaces", {}).values()
                    if i.get("mac_address")]
            pxe = self._pxe_config(macs[0]) if macs else None
            match = re.search(r"autoyast=(\S+)", pxe or "")
            if match:
                self._install(system_name, match.group(1))
            else:
                minion_id = self._system_minion(system_name)
                if minion_id and self.minions.installed(minion_id):
                    self.minions.start(minion_id, f"{system_name} boots from disk")
                    self._autostart_domains(system_name)
                else:
                    log.warning("%s: no PXE config and no installed OS", system_name)
        except Exception:
            log.exception("boot of %s failed", system_name)

    def _install(self, system_name: str, autoyast_url: str) -> None:
        delay, fail = self.faults.take("pxe")
        if delay:
            time.sleep(delay)
        if fail:
            log.warning("fault knob: install of %s fails", system_name)
            return
        rendered = parse_autoyast(self._fetch(autoyast_url))
        minion_id = rendered.files.get("/etc/salt/minion_id", "").strip() or system_name
        minion_d = {Path(p).name: text for p, text in rendered.files.items()
                    if p.startswith("/etc/salt/minion.d/")}
        # the minion's extension modules the profile writes (the libvirt events engine), where
        # the host's Salt looks for them: the lab minion's root_dir stands for "/"
        extmods = {p: text for p, text in rendered.files.items()
                   if p.startswith(HOST_EXTMODS) and not p.endswith("/")}
        (self.paths.simulator / "systems").mkdir(parents=True, exist_ok=True)
        (self.paths.simulator / "systems" / f"{system_name}.minion").write_text(minion_id)
        grains = yaml.safe_load(minion_d.get("50-store-rollout.conf", "")) or {}
        store_id = str((grains.get("grains") or {}).get("store_id", ""))
        (self.paths.simulator / "systems" / f"{system_name}.store").write_text(store_id)
        # the virt URI and images dir come from the profile (Cobbler's autoinstall_meta), as on
        # a real host: the lab adds nothing there
        extra: dict[str, Any] = {}
        if self.faults.take("startup_highstate")[1]:
            # the installed host comes up without its first highstate (lost or crashed run)
            log.warning("fault knob: %s starts without its startup highstate", system_name)
            extra["startup_states"] = ""
        # a Leap 15.6 host runs the distribution's Salt 3006 (built-in virt module); on request
        # its stock 3006.0 on Python 3.6, whose auth protocol 2 the master refuses
        salt_bin = HOST_SALT_BIN
        if self.faults.take("old_host_salt")[1]:
            log.warning("fault knob: %s runs Salt 3006.0 on Python 3.6", system_name)
            salt_bin = HOST_PY36_SALT_BIN
        self.minions.install(minion_id, minion_d, extra, salt_bin=salt_bin, store_host=True,
                             disk_files=extmods)
        # end of install (AutoYaST post step): tell Cobbler, so netboot turns off; the URL is
        # the one Cobbler rendered (the profile's http_server carries the port)
        if rendered.nopxe_url:
            self._nopxe(rendered.nopxe_url)
        self.minions.start(minion_id, f"{system_name} installed from {autoyast_url}")

    def _nopxe(self, url: str) -> None:
        """Cobbler's nopxe answers 200 with "True" or "False" (pxe_just_once off, no such
        system): with "False" netboot stays on and the host reinstalls at its next boot, so the
        install stops here, logged, instead of looking done."""
        answer = self._fetch(url).strip()
        if answer != "True":
            raise RuntimeError(f"installer: Cobbler answered {answer!r} to {url}, not 'True': "
                               "netboot stays on; check Cobbler's pxe_just_once setting and "
                               "that the system exists")

    def _fetch(self, url: str) -> str:
        """GET as the installing machine does: from the store network, by the address Cobbler
        rendered (a URL that only works on the orchestrator fails here, as on a store)."""
        proc = self.minions.network().run(
            [sys.executable, "-c", _FETCH, url], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"installer: GET {url} from the store network failed: "
                               f"{proc.stderr.strip()}")
        return proc.stdout

    # -- reboots -----------------------------------------------------------------------
    def reboot(self, minion_id: str) -> dict[str, Any]:
        self.minions.minion_dir(minion_id)  # validates the id
        threading.Thread(target=self._reboot, args=(minion_id,), daemon=True).start()
        return {"minion": minion_id, "rebooting": True}

    def _reboot(self, minion_id: str) -> None:
        time.sleep(1.0)  # like `shutdown -r`: the state run that asked returns first
        self.minions.stop(minion_id, "reboot")
        delay, fail = self.faults.take("reboot")
        time.sleep(0.5 + delay)  # powered off
        if fail:
            log.warning("fault knob: %s does not come back after reboot", minion_id)
            return
        if self._domain_gone(minion_id):
            log.info("%s: its domain was stopped or removed during the reboot; stays down",
                     minion_id)
            return
        self.minions.start(minion_id, "reboot")

    def _domain_gone(self, minion_id: str) -> bool:
        """A VM whose domain is no longer running cannot come back from a reboot (a rollback
        that destroys the domain mid-firstboot)."""
        import libvirt

        names = [name for name, mid in self.domain_minions.items() if mid == minion_id]
        if not names:
            return False  # a hypervisor: hardware the simulator owns
        conn = libvirt.openReadOnly(self.info.libvirt_uri)
        try:
            return not conn.lookupByName(names[0]).isActive()
        except libvirt.libvirtError:
            return True  # undefined
        finally:
            conn.close()

    # -- VM boot (libvirt events) --------------------------------------------------------
    def _on_domain_started(self, dom: Any) -> None:
        try:
            xml = ET.fromstring(dom.XMLDesc(0))
            delay, fail = self.faults.take("vm_boot")
            if delay:
                time.sleep(delay)
            if fail:
                log.warning("fault knob: VM %s does not boot", dom.name())
                return
            if self._boots_for_real(xml):
                log.info("domain %s: its disk holds a built image; the guest boots it and runs "
                         "its own minion (full lab), nothing to simulate", dom.name())
                return
            booted = self._minion_of_disk(xml)
            seeded = self._identity_from_seed(dom.name(), xml)
            if seeded is None and booted is None:
                log.info("domain %s: no seed disk and a disk that never booted; no minion",
                         dom.name())
                return
            minion_id = seeded["minion_id"] if seeded else str(booted)
            self.domain_minions[dom.name()] = minion_id
            if seeded and (not self.minions.installed(minion_id)
                           or self._disk_changed(minion_id, xml)):
                from tasks.kiwi import render_minion_d

                files = render_minion_d(*seeded["image"])
                files.update(seeded["minion.d"])
                self.minions.install(minion_id, files, {})
                (self.minions.minion_dir(minion_id) / "disk").write_text(self._disk_identity(xml))
            self.minions.start(minion_id, f"domain {dom.name()} started")
        except Exception:
            log.exception("VM boot of %s failed", dom.name())

    def _identity_from_seed(self, name: str, xml: ET.Element) -> dict[str, Any] | None:
        """What the image's store-identity writes at boot from the domain's seed disk: the
        minion id and the minion.d files, with the image (description, build params) the
        disk is backed by; None when no CD-ROM holds a STORE_SEED ISO."""
        from tasks.kiwi import IDENTITY_SCRIPT

        for source in xml.iterfind("./devices/disk[@device='cdrom']/source"):
            iso = Path(source.get("file", ""))
            if not iso.is_file() or self._iso_label(iso) != SEED_LABEL:
                continue
            with tempfile.TemporaryDirectory(dir=self.paths.simulator) as tmp:
                seed, salt_dir = Path(tmp) / "seed", Path(tmp) / "salt"
                subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(iso),
                                "-extract", "/", str(seed)],
                               check=True, capture_output=True)  # fmt: skip
                image = self._image_meta(xml)
                script = image[0] / "root" / IDENTITY_SCRIPT
                proc = subprocess.run(
                    [str(script)], capture_output=True, text=True, check=False,
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                         IDENTITY_SEED_DIR_ENV: str(seed),
                         IDENTITY_SALT_DIR_ENV: str(salt_dir)})
                if proc.returncode != 0:
                    log.warning("domain %s: store-identity refused its seed: %s", name,
                                proc.stderr.strip())
                    return None
                id_file = salt_dir / "minion_id"
                if not id_file.exists():
                    log.warning("domain %s: seed disk %s gave no identity: %s", name, iso,
                                proc.stdout.strip())
                    return None
                minion_d = salt_dir / "minion.d"
                files = {f.name: f.read_text() for f in sorted(minion_d.glob("*.conf"))} \
                    if minion_d.is_dir() else {}
                return {"minion_id": id_file.read_text().strip(), "minion.d": files,
                        "image": image}
        return None

    @staticmethod
    def _iso_label(path: Path) -> str:
        proc = subprocess.run(["blkid", "-p", "-s", "LABEL", "-o", "value", str(path)],
                              capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    def _minion_of_disk(self, xml: ET.Element) -> str | None:
        """The minion a disk was given on an earlier boot (its /etc/salt/minion_id)."""
        identity = self._disk_identity(xml)
        for marker in self.minions.base.glob("*/disk"):
            if marker.read_text() == identity:
                return marker.parent.name
        return None

    @staticmethod
    def _disk_path(xml: ET.Element) -> str:
        source = xml.find("./devices/disk[@device='disk']/source")
        return source.get("file", "") if source is not None else ""

    def _disk_identity(self, xml: ET.Element) -> str:
        """The system disk as the guest knows it: a domain defined anew (its own UUID) has a new
        overlay, a fresh disk, even at the same path (a rollback, then a rerun)."""
        return f"{xml.findtext('./uuid', '')} {self._disk_path(xml)}"

    def _disk_changed(self, minion_id: str, xml: ET.Element) -> bool:
        marker = self.minions.minion_dir(minion_id) / "disk"
        return not marker.exists() or marker.read_text() != self._disk_identity(xml)

    def _boots_for_real(self, xml: ET.Element) -> bool:
        """The disk's base image is an operating system (built by KIWI), not a lab builder's
        disk (any version: a VM made before the lab builder's tag changed is still a lab VM)."""
        from tasks.kiwi import LabBuilder

        lab_family = LabBuilder.tag.rsplit("-", 1)[0] + "-"  # "lab-"
        return not str(self._base_meta(xml).get("builder", "")).startswith(lab_family)

    def _image_meta(self, xml: ET.Element) -> tuple[Path, dict[str, str]]:
        """The KIWI description and build parameters of the image this domain's disk is an
        overlay of (from the base image's meta.json)."""
        from tasks.kiwi import resolve_description

        meta = self._base_meta(xml)
        return resolve_description(meta["description"]), meta.get("params", {})

    def _base_meta(self, xml: ET.Element) -> dict[str, Any]:
        """meta.json of the base image this domain's disk is an overlay of."""
        disk = self._disk_path(xml)
        info = json.loads(subprocess.run(
            ["qemu-img", "info", "--force-share", "--output=json", "--backing-chain", disk],
            check=True, capture_output=True, text=True).stdout)
        chain = info if isinstance(info, list) else [info]
        base = Path(chain[-1]["filename"])
        meta_path = base.parent / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{disk}: base image {base} has no meta.json (not from the cache)")
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        return meta

    def _on_domain_stopped(self, name: str) -> None:
        minion_id = self.domain_minions.get(name)
        if minion_id:
            # a destroyed domain is a power cut: the guest gets no grace in which its minion
            # could re-authenticate after a rollback deleted its key (as CI saw once)
            self.minions.stop(minion_id, f"domain {name} stopped", grace=0.0)

    def run_libvirt_events(self) -> None:
        import libvirt

        libvirt.virEventRegisterDefaultImpl()
        threading.Thread(target=self._event_loop, daemon=True, name="libvirt-loop").start()
        while not self.stopping.is_set():
            try:
                conn = libvirt.openReadOnly(self.info.libvirt_uri)
            except libvirt.libvirtError:
                time.sleep(1)
                continue
            closed = threading.Event()
            conn.registerCloseCallback(lambda *_a, _closed=closed: _closed.set(), None)

            def lifecycle(_conn: Any, dom: Any, event: int, _detail: int, _opaque: Any) -> None:
                if event == libvirt.VIR_DOMAIN_EVENT_STARTED:
                    threading.Thread(target=self._on_domain_started, args=(dom,),
                                     daemon=True).start()
                elif event in (libvirt.VIR_DOMAIN_EVENT_STOPPED,
                               libvirt.VIR_DOMAIN_EVENT_SHUTDOWN):
                    threading.Thread(target=self._on_domain_stopped, args=(dom.name(),),
                                     daemon=True).start()

            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)
            conn.setKeepAlive(5, 3)
            # domains already running when the simulator (re)starts get their minions back
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                threading.Thread(target=self._on_domain_started, args=(dom,), daemon=True).start()
            while not self.stopping.is_set() and not closed.is_set():
                time.sleep(0.5)
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    @staticmethod
    def _event_loop() -> None:
        import libvirt

        while True:
            libvirt.virEventRunDefaultImpl()


def make_handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, "ok")
            elif self.path == "/minions":
                self._reply(200, {"running": sim.minions.status(),
                                  "history": sim.minions.history[-200:]})
            elif self.path == "/faults":
                self._reply(200, sim.faults.snapshot())
            elif self.path == "/faults/taken":
                self._reply(200, sim.faults.taken_snapshot())
            else:
                self._reply(404, {"error": "not found"})

        def do_DELETE(self) -> None:
            match = re.fullmatch(r"/faults(?:/(\w+))?", self.path)
            if match:
                sim.faults.clear(match.group(1))
                self._reply(200, sim.faults.snapshot())
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            try:
                body = self._json()
                if self.path == "/power":
                    if not sim.bmc_login_ok(self.headers.get("Authorization")):
                        self._reply(401, {"error": "BMC login refused"})
                        return
                    self._reply(200, sim.power_action(str(body.get("action", "")),
                                                      str(body.get("plug", ""))))
                elif self.path == "/hooks/vm_start":
                    delay, fail = sim.faults.take("vm_start")
                    time.sleep(delay)
                    self._reply(200, {"fail": fail, "domain": body.get("domain")})
                elif m := re.fullmatch(r"/minions/([^/]+)/reboot", self.path):
                    self._reply(200, sim.reboot(m.group(1)))
                elif m := re.fullmatch(r"/faults/(\w+)", self.path):
                    sim.faults.set(m.group(1), body)
                    self._reply(200, sim.faults.snapshot())
                else:
                    self._reply(404, {"error": "not found"})
            except ValueError as exc:
                self._reply(400, {"error": str(exc)})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="store hardware simulator")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sim = Simulator(LabPaths(args.state_dir))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(sim))
    server.daemon_threads = True

    def shutdown(*_: Any) -> None:
        sim.stopping.set()
        sim.minions.stop_all()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, shutdown)
    threading.Thread(target=sim.run_libvirt_events, daemon=True, name="libvirt-events").start()
    server.serve_forever()


if __name__ == "__main__":
    main()
