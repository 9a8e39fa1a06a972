"""salt-minion processes of the simulated machines: their disks, configs, addresses and
namespaces."""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil
import yaml

from lab.boxes import Box, netns_pid
from lab.procs import ProcessRecord, spawn, stop
from lab.regions import publish_port_of
from lab.salt_master import daemon_paths
from lab.simulator.faults import FaultKnobs
from lab.state import REPO_ROOT, VENV_BIN, LabInfo, LabPaths
from lab.store_network import StoreNetwork, machine_address
from lab.wan import join_options

log = logging.getLogger("lab.simulator")

UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
SALT_LONGEST_SOCKET_NAME = "minion_event_0123456789_pull.ipc"  # salt: sha256(id)[:10]
# beside a store host's disk: what its firmware's SMBIOS says (lab/host_namespace.py serves it)
SMBIOS_SERIAL_FILE = "smbios-serial"
# beside a store host's disk: the dir of the box's own libvirtd (lab/boxes.py), when it has one
BOX_FILE = "own-libvirt-box"


def clear_stale_pidfiles(root: Path) -> None:
    """A booting machine's /run is empty: drop pidfiles whose process is gone or a zombie (a
    killed minion's zombie that init has not reaped yet would make the next minion exit as
    "already running"); one naming a live process stays and keeps a second minion out."""
    for pidfile in root.glob("*.pid"):
        try:
            text = pidfile.read_text().strip()
            pid = int(json.loads(text)["pid"]) if text.startswith("{") else int(text)
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
        except (OSError, ValueError, KeyError, psutil.NoSuchProcess):
            pass
        except psutil.Error:
            continue
        pidfile.unlink(missing_ok=True)


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

    def __init__(self, paths: LabPaths, info: LabInfo, faults: FaultKnobs | None = None) -> None:
        self.paths = paths
        self.faults = faults or FaultKnobs()
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
                disk_files: dict[str, str] | None = None,
                smbios_serial: str | None = None,
                os_grains: dict[str, str] | None = None, box: Box | None = None) -> Path:
        """Lay down a fresh system disk: config dir with the given minion.d files, and the Salt
        installed on it (`salt_bin`: the bin dir of that Salt's venv); `disk_files`: other files
        by their absolute path on a real machine, under the machine's root_dir (its "/");
        `smbios_serial`: the serial the machine's firmware reports (a store host's); `box`: a
        store host's own libvirtd (lab/boxes.py), whose namespace its minion joins."""
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
            if os_grains:  # the OS the machine stands for, in its grains file (Salt's own
                # grains of the lab's Debian would say otherwise; grains.setvals edits it)
                (conf / "grains").write_text(yaml.safe_dump(os_grains))
            for path, text in (disk_files or {}).items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            self._write_hardware_config(minion_id, root, extra, files)
            (mdir / "salt-bin").write_text(str(salt_bin))
            if store_host:
                (mdir / "store-host").write_text("runs in a mount namespace without the lab\n")
            if smbios_serial:
                (mdir / SMBIOS_SERIAL_FILE).write_text(smbios_serial)
            if box is not None:
                (mdir / BOX_FILE).write_text(str(box.dir))
            return mdir

    def _write_hardware_config(self, minion_id: str, root: Path, extra: dict[str, Any],
                               files: dict[str, str]) -> None:
        """`root`: the machine's disk, root_dir() (short, by machine number: Salt puts the
        event sockets under root_dir and their path must fit the kernel's limit); `files`:
        its minion.d, whose master port (its region's master) is kept."""
        mdir = self.minion_dir(minion_id)
        ret_port, publish_port = publish_port_of(self.paths.load_or_create_ports(),
                                                 _master_port(files))
        hardware = {
            # what differs between a lab process and a real machine: paths, ports, virt URI
            "id": minion_id,
            "user": "root",
            **daemon_paths(root, "minion"),
            "master_port": ret_port,
            "publish_port": publish_port,
            "acceptance_wait_time": 1,
            "acceptance_wait_time_max": 2,
            "random_reauth_delay": 0,
            "auth_timeout": 5,
            "multiprocessing": False,
            # the hardware's API (reboots), as a machine on the store network reaches it, and the
            # overlay's module that calls it for provisioning.reboot/restart_minion
            "store_rollout_lab": {"simulator_url": self.network().url(self.simulator_port)},
            # no systemd in a minion process: its units are the overlay's lab_service's
            "providers": {"provisioning": "lab_provisioning", "service": "lab_service"},
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
            clear_stale_pidfiles(self.root_dir(minion_id))
            marker = mdir / "salt-bin"  # absent in a lab state dir from before it existed
            salt_bin = Path(marker.read_text()) if marker.exists() else VENV_BIN
            argv = [str(salt_bin / "salt-minion"), "-c", str(mdir / "etc"), "-l", "warning"]
            argv = self._apart(minion_id, mdir, salt_bin, argv)
            record = spawn(
                argv,
                self.logs / f"minion-{minion_id}.log",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONWARNINGS": "ignore"},
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
        box = self.box_of(minion_id)
        if box is not None:  # the box's network namespace, which its libvirtd shares
            unshare = ["nsenter", f"--net=/proc/{netns_pid(box)}/ns/net", "--", "unshare"]
            options: list[str] = []
        else:
            unshare = ["unshare", "--net"]
            options = self.network().join_args(minion_id, self.address(minion_id))
            options += join_options(self.info, minion_id)  # its store's WAN link (lab/wan.py)
        root = self.root_dir(minion_id)
        options += ["--boot-root", str(root)]
        # the step's knob at a boot with enabled units; the machine's own at its next boot
        has_units = (root / "etc" / "systemd" / "system" / "multi-user.target.wants").is_dir()
        own = self.faults.armed("service_start", minion_id)
        _, fails = self.faults.take("service_start", minion_id, own_only=not has_units)
        if fails:
            log.warning("fault knob: %s's units fail to start in this boot%s", minion_id,
                        ", and every start after" if own else "")
            options += ["--units-fail", *(["--units-fail-whole-boot"] if own else [])]
        if (mdir / "store-host").exists():
            keep = [mdir, self.root_dir(minion_id)]
            if box is None:
                socket = parse_qs(urlparse(self.info.libvirt_uri).query)["socket"][0]
                keep += [Path(socket).parent, Path(self.info.vm_images_dir)]
            else:  # its own libvirtd's socket and PKI dir, its images at the common path
                keep += [box.sock_dir, box.pki]
                options += ["--bind", str(box.images), str(box.common_images)]
            unshare += ["--mount", "--propagation", "private"]
            options += ["--hide", str(self.paths.root), *[f"--keep={path}" for path in keep]]
            if (mdir / SMBIOS_SERIAL_FILE).exists():
                options += ["--smbios-serial", (mdir / SMBIOS_SERIAL_FILE).read_text()]
        return [*unshare, "--", str(salt_bin / "python"),
                str(REPO_ROOT / "lab" / "host_namespace.py"), *options, "--", *argv]

    def box_of(self, minion_id: str) -> Box | None:
        """The own libvirtd box a store host's minion runs on (lab/boxes.py), else None."""
        marker = self.minion_dir(minion_id) / BOX_FILE
        if not marker.exists():
            return None
        path = Path(marker.read_text())
        return Box(path.name, path, Path(self.info.vm_images_dir))

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


def _master_port(files: dict[str, str]) -> int | None:
    """The master port a machine's minion.d files set (the last file's that sets one)."""
    port = None
    for name in sorted(files):
        try:
            conf = yaml.safe_load(files[name])
        except yaml.YAMLError:
            continue
        if isinstance(conf, dict) and str(conf.get("master_port", "")).isdigit():
            port = int(conf["master_port"])
    return port
