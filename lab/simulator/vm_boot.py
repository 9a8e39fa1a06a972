"""VM boot: a libvirt lifecycle callback starts a salt-minion for each started domain with the
identity its seed disk gives, else the one its data disk keeps (a domain whose disk holds a
built image boots for real); its data disk's content is the minion's /srv/store while it runs
(lab/simulator/data_disk.py); the ACPI power button (QEMU's POWERDOWN) shuts a simulated VM
down cleanly; a store host's domain (lab/hardware.py) powering on or off goes to the
firmware."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from lab.boxes import Box, all_boxes
from lab.hardware import host_of
from lab.simulator.data_disk import (
    MOUNTED_MARKER,
    DataDiskMounts,
    data_disk_of,
    extract,
    mount_point,
)
from lab.simulator.faults import FaultKnobs
from lab.simulator.minions import MinionManager
from lab.simulator.system_disks import SystemDisks
from lab.state import LAB_IMAGE_BUILDS_DIR, LabInfo, LabPaths
from store_rollout.contracts import (
    DATA_DISK_IDENTITY_DIR,
    IDENTITY_DATA_DIR_ENV,
    IDENTITY_SALT_DIR_ENV,
    IDENTITY_SEED_DIR_ENV,
    SEED_LABEL,
)

log = logging.getLogger("lab.simulator")


class StoreHosts(Protocol):
    """What a store host's power events set off (lab/simulator/firmware.py)."""

    def host_powered_on(self, system_name: str) -> None: ...
    def host_powered_off(self, system_name: str) -> None: ...
    def host_running(self, system_name: str) -> None: ...


class VmBoot:
    """Which domain runs which minion, kept from libvirt's lifecycle events."""

    def __init__(self, paths: LabPaths, info: LabInfo, faults: FaultKnobs, minions: MinionManager,
                 stopping: threading.Event) -> None:
        self.paths = paths
        self.info = info
        self.faults = faults
        self.minions = minions
        self.stopping = stopping
        self.domain_minions: dict[str, str] = {}
        self.lock = threading.Lock()
        self.domain_locks: dict[str, threading.RLock] = {}  # a domain's events, one at a time
        self.mounts = DataDiskMounts(minions.minion_dir)
        self.system_disks = SystemDisks(paths.simulator / "system-disks", self._local_of_minion)
        self.host_names: set[str] = set()
        self.hosts: StoreHosts | None = None  # the firmware, once it exists
        # boxes with a libvirtd of their own (lab/boxes.py), by name, while they are on; each
        # domain's home: the box whose libvirtd runs it (None: the lab's shared libvirtd)
        self.boxes: dict[str, Box] = {}
        self.box_stops: dict[str, threading.Event] = {}
        self.home: dict[str, str | None] = {}
        self.booted: set[tuple[str, str, int]] = set()  # (box, domain, its run's id) handled
        self.box_busy: set[str] = set()  # boxes the firmware is powering on or off right now

    # -- boxes with a libvirtd of their own ----------------------------------------------
    def box_on(self, box: Box, fresh: bool) -> None:
        """Follow a box's libvirtd (`fresh`: just started, so the domains it runs are booting:
        its own autostart at start)."""
        with self.lock:
            if box.name in self.box_stops and not self.box_stops[box.name].is_set():
                return
            stop = threading.Event()
            self.boxes[box.name], self.box_stops[box.name] = box, stop
        threading.Thread(target=self._watch, args=(box.uri, box, stop, fresh), daemon=True,
                         name=f"libvirt-events-{box.name}").start()

    @contextlib.contextmanager
    def box_power(self, box: Box) -> Iterator[None]:
        """The firmware powers `box` on or off: the scan for running boxes leaves it alone."""
        with self.lock:
            self.box_busy.add(box.name)
        try:
            yield
        finally:
            with self.lock:
                self.box_busy.discard(box.name)

    def _follow_boxes(self) -> None:
        """Every box libvirtd that runs is followed, whoever started it: the simulator's
        firmware at a box's boot, a simulator before this one, a test's bench."""
        while not self.stopping.is_set():
            with contextlib.suppress(Exception):
                for box in all_boxes(self.paths.root, self.info.vm_images_dir):
                    with self.lock:
                        skip = box.name in self.box_busy or box.name in self.boxes
                    if not skip and box.running():
                        self.box_on(box, fresh=False)
            self.stopping.wait(1.0)

    def box_off(self, box: Box) -> None:
        """A box's power cut: its events are no longer followed; the VMs it ran stop at once,
        their minions without a data disk write-back (the guest's writes since boot are lost)."""
        with self.lock:
            stop = self.box_stops.pop(box.name, None)
            self.boxes.pop(box.name, None)
            names = [name for name, home in self.home.items() if home == box.name]
        if stop is not None:
            stop.set()
        for name in names:
            minion_id = self.domain_minions.get(name)
            with self._domain_lock(name):
                if minion_id:
                    self.minions.stop(minion_id, f"power cut of {box.name}", grace=0.0)
                    self.mounts.discard(minion_id)
                self.home.pop(name, None)

    def _box_named(self, name: str | None) -> Box | None:
        return self.boxes.get(name) if name else None

    def _uri(self, box_name: str | None) -> str:
        box = self._box_named(box_name)
        return box.uri if box is not None else self.info.libvirt_uri

    def _local(self, box: Box | None, path: str | Path) -> Path:
        """A domain's file as the simulator reaches it (a box's own images dir)."""
        return box.local(path) if box is not None else Path(path)

    def _local_of_minion(self, minion_id: str, path: Path) -> Path:
        names = [name for name, mid in self.domain_minions.items() if mid == minion_id]
        box = self._box_named(self.home.get(names[0])) if names else None
        return self._local(box, path)

    def _rehome(self, name: str, box: Box | None) -> None:
        """A live migration ended on `box`: the guest runs on (no reboot: its minion and its
        /srv/store stay), and the data disk it writes back at its next stop is the new box's."""
        box_name = box.name if box is not None else None
        with self._domain_lock(name):
            old = self.home.get(name)
            if old == box_name:
                return
            self.home[name] = box_name
            minion_id = self.domain_minions.get(name)
            mounted = self.mounts.mounted(minion_id) if minion_id else None
            if minion_id and mounted is not None:
                old_box = self._box_named(old)
                common = old_box.common(mounted) if old_box is not None else mounted
                self.mounts.moved(minion_id, self._local(box, common))
            log.info("domain %s migrated from %s to %s: its minion %s runs on", name,
                     old or "the shared libvirtd", box_name or "the shared libvirtd", minion_id)

    def _migrated_away(self, name: str, box: Box | None) -> None:
        """The source's end of a migration: the domain runs on another box now (its start
        there re-homed it already, or is found here)."""
        if self.home.get(name) != (box.name if box is not None else None):
            return
        for other in list(self.boxes.values()) + [None]:
            if other is not box and self._active(name, other.name if other else None):
                self._rehome(name, other)
                return
        log.warning("domain %s migrated away from %s to no libvirtd the lab follows", name,
                    box.name if box is not None else "the shared libvirtd")

    def domain_gone(self, minion_id: str) -> bool:
        """A VM whose domain is no longer running cannot come back from a reboot (a rollback
        that destroys the domain mid-firstboot)."""
        names = [name for name, mid in self.domain_minions.items() if mid == minion_id]
        if not names:
            return False  # a hypervisor: hardware the simulator owns
        return not self._active(names[0], self.home.get(names[0]))

    def _on_domain_started(self, dom: Any, booting: bool = True, box: Box | None = None) -> None:
        try:
            if box is not None:
                run = (box.name, dom.name(), dom.ID())
                with self.lock:  # a fresh box's autostart seen both listed and by its event
                    if run in self.booted:
                        return
                    self.booted.add(run)
            desc = dom.XMLDesc(0)
            if box is None and host_of(desc) is not None and self.hosts is not None:
                if booting:
                    self.hosts.host_powered_on(dom.name())
                else:
                    self.hosts.host_running(dom.name())
                return
            xml = ET.fromstring(desc)
            if self._boots_for_real(xml, box):
                log.info("domain %s: its disk holds a built image; the guest boots it and runs "
                         "its own minion (full lab), nothing to simulate", dom.name())
                return
            with self._domain_lock(dom.name()):
                self.home[dom.name()] = box.name if box is not None else None
                self._boot_vm(dom.name(), xml, booting, box)
        except Exception:
            log.exception("VM boot of %s failed", dom.name())

    def _boot_vm(self, name: str, xml: ET.Element, booting: bool, box: Box | None = None) -> None:
        """A VM's boot: its data disk's content at the minion's /srv/store, the identity the
        image's store-identity gives (the seed, else the data disk's), a fresh system disk when
        the domain's is new (the image's minion.d, the seed's or the restored identity), its
        minion started. `booting` False: a running domain the simulator found at its start;
        `box`: the box whose own libvirtd runs it (its files are that box's)."""
        previous = self.domain_minions.get(name)
        if booting and previous:  # a boot: the previous boot's processes are gone
            self.minions.stop(previous, f"domain {name} booting again", grace=0.0)
            self._unmount(previous)
        found = data_disk_of(xml)
        data = self._local(box, found) if found is not None else None
        with tempfile.TemporaryDirectory(dir=self.paths.simulator) as tmp:
            staged = None
            if booting and data is not None and data.exists():
                self._unmount_elsewhere(data)
                staged = Path(tmp) / "data"
                extract(data, staged)
            identity = self._identity(name, xml, staged, box)
            booted = self._minion_of_disk(xml)
            if identity is None and booted is None:
                log.info("domain %s: no seed disk, no identity on a data disk and a disk that "
                         "never booted; no minion", name)
                return
            minion_id = identity["minion_id"] if identity else str(booted)
            delay, fail = self.faults.take("vm_boot", name, minion_id)
            if delay:
                time.sleep(delay)
            if fail:
                log.warning("fault knob: VM %s does not boot", name)
                return
            self.domain_minions[name] = minion_id
            with self.minions.machine_lock(minion_id):
                root = self.minions.root_dir(minion_id)
                if identity and (not self.minions.installed(minion_id)
                                 or self._disk_changed(minion_id, xml)):
                    self._system_disk(minion_id, xml, identity, data)
                if staged is not None and data is not None:
                    self.mounts.mount(minion_id, root, data, staged)
                self.minions.start(minion_id, f"domain {name} started")

    def _system_disk(self, minion_id: str, xml: ET.Element, identity: dict[str, Any],
                     data: Path | None) -> None:
        """Another system disk boots (the machine's minion stopped): the root of the one it
        leaves is kept; the disk's own root comes back if it booted here before (a revert), else
        a fresh disk: the image's minion.d as store-identity left it, the minion's keys on the
        data disk (the image's 30-data-disk.conf, here under the machine's root)."""
        mdir, root = self.minions.minion_dir(minion_id), self.minions.root_dir(minion_id)
        marker, disk = mdir / "disk", self._disk_identity(xml)
        left = marker.read_text() if marker.exists() else ""
        if self.minions.installed(minion_id) and left.split(" ")[0] == disk.split(" ")[0]:
            # the same domain's other disk (a domain defined anew never boots the old one)
            self.system_disks.leave(minion_id, left, mdir, root, data is not None)
        if not self.system_disks.back(minion_id, disk, mdir, root):
            extra = {} if data is None else {"pki_dir": str(
                mount_point(root) / DATA_DISK_IDENTITY_DIR / "pki" / "minion")}
            self.minions.install(minion_id, identity["minion.d"], extra)
        marker.write_text(disk)

    def _domain_lock(self, name: str) -> threading.RLock:
        with self.lock:
            return self.domain_locks.setdefault(name, threading.RLock())

    def _unmount(self, minion_id: str) -> None:
        with self.minions.machine_lock(minion_id):
            self.mounts.unmount(minion_id, self.minions.root_dir(minion_id))

    def _unmount_elsewhere(self, disk: Path) -> None:
        """A data disk is one machine's at a time: a machine that still has `disk`'s content
        (a stop not handled yet) is stopped and writes it back first."""
        for marker in sorted(self.minions.base.glob(f"*/{MOUNTED_MARKER}")):
            minion_id = marker.parent.name
            if self.mounts.mounted(minion_id) == disk:
                self.minions.stop(minion_id, f"data disk {disk} is booting elsewhere", grace=0.0)
                self._unmount(minion_id)

    def _identity(self, name: str, xml: ET.Element, data_dir: Path | None,
                  box: Box | None = None) -> dict[str, Any] | None:
        """What the image's store-identity writes at boot from the domain's seed disk or, with
        none, from the identity its data disk keeps (`data_dir`: the disk's content, where it
        also keeps a seeded identity): the minion id and the minion.d files (the image's, as the
        script leaves them), with the image (description, build params) the disk is backed by;
        None when neither gives one."""
        from lab.image_builder import render_minion_d
        from tasks.kiwi import IDENTITY_SCRIPT

        iso = self._seed_iso(xml, box)
        if iso is None and data_dir is None:
            return None
        image = self._image_meta(xml, box)
        with tempfile.TemporaryDirectory(dir=self.paths.simulator) as tmp:
            seed, salt_dir = Path(tmp) / "seed", Path(tmp) / "salt"
            if iso is not None:
                subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(iso),
                                "-extract", "/", str(seed)],
                               check=True, capture_output=True)  # fmt: skip
            else:
                seed.mkdir()  # the seed was ejected: an empty CD-ROM drive
            (salt_dir / "minion.d").mkdir(parents=True)
            for filename, text in render_minion_d(*image).items():
                (salt_dir / "minion.d" / filename).write_text(text)
            no_data = Path(tmp) / "no-data-disk"  # never the lab host's own /srv/store
            no_data.mkdir()
            proc = subprocess.run(
                [str(image[0] / "root" / IDENTITY_SCRIPT)], capture_output=True, text=True,
                check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                  IDENTITY_SEED_DIR_ENV: str(seed),
                                  IDENTITY_SALT_DIR_ENV: str(salt_dir),
                                  IDENTITY_DATA_DIR_ENV: str(data_dir or no_data)})
            if proc.returncode != 0:
                log.warning("domain %s: store-identity refused its identity: %s", name,
                            proc.stderr.strip())
                return None
            id_file = salt_dir / "minion_id"
            if not id_file.exists():
                log.info("domain %s: store-identity gave no identity: %s", name,
                         proc.stdout.strip())
                return None
            files = {f.name: f.read_text() for f in sorted((salt_dir / "minion.d").glob("*.conf"))}
            return {"minion_id": id_file.read_text().strip(), "minion.d": files,
                    "image": image, "seeded": iso is not None}

    def _seed_iso(self, xml: ET.Element, box: Box | None = None) -> Path | None:
        """The STORE_SEED ISO in one of the domain's CD-ROMs, or None."""
        for source in xml.iterfind("./devices/disk[@device='cdrom']/source"):
            iso = self._local(box, source.get("file", ""))
            if iso.is_file() and self._iso_label(iso) == SEED_LABEL:
                return iso
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

    def _boots_for_real(self, xml: ET.Element, box: Box | None = None) -> bool:
        """The disk's base image is an operating system (built by KIWI), not a lab builder's
        disk (any version: a VM made before the lab builder's tag changed is still a lab VM)."""
        from lab.image_builder import LabBuilder

        lab_family = LabBuilder.tag.rsplit("-", 1)[0] + "-"  # "lab-"
        return not str(self._base_meta(xml, box).get("builder", "")).startswith(lab_family)

    def _image_meta(self, xml: ET.Element, box: Box | None = None) -> tuple[Path, dict[str, str]]:
        """The KIWI description and build parameters of the image this domain's disk is an
        overlay of (from the base image's meta.json)."""
        from tasks.kiwi import resolve_description

        meta = self._base_meta(xml, box)
        # meta.json names the description, not its directory: the lab's own are under lab/
        lab_own = LAB_IMAGE_BUILDS_DIR / meta["description"]
        desc_dir = lab_own if lab_own.is_dir() else resolve_description(meta["description"])
        return desc_dir, meta.get("params", {})

    def _base_meta(self, xml: ET.Element, box: Box | None = None) -> dict[str, Any]:
        """meta.json of the base image this domain's disk is an overlay of (the backing chain
        followed file by file: a box's files name the common images path)."""
        disk = self._disk_path(xml)
        base = self._local(box, disk)
        for _ in range(16):
            info = json.loads(subprocess.run(
                ["qemu-img", "info", "--force-share", "--output=json", str(base)],
                check=True, capture_output=True, text=True).stdout)
            backing = info.get("full-backing-filename") or info.get("backing-filename")
            if not backing:
                break
            base = self._local(box, backing)
        meta_path = base.parent / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{disk}: base image {base} has no meta.json (not from the cache)")
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        return meta

    def _on_domain_stopped(self, name: str, box: Box | None = None) -> None:
        if box is None and name in self.host_names and self.hosts is not None:
            self.hosts.host_powered_off(name)
            return
        minion_id = self.domain_minions.get(name)
        if not minion_id:
            return
        with self._domain_lock(name):
            if not stop_counts(self.home.get(name), box.name if box is not None else None):
                return  # another libvirtd's domain of that name (a move's other end)
            if self._active(name, self.home.get(name)):
                return  # a stale stop: the domain runs again, and its boot stopped that minion
            # a destroyed domain is a power cut: the guest gets no grace in which its minion
            # could re-authenticate after a rollback deleted its key (as CI saw once)
            self.minions.stop(minion_id, f"domain {name} stopped", grace=0.0)
            self._unmount(minion_id)

    def _on_powerdown(self, name: str, box: Box | None = None) -> None:
        """The ACPI power button (storevirt.shutdown): a simulated VM's guest shuts down cleanly
        (its minion stops, its data disk is written back) and powers off. A store host's
        domain has no OS to answer it (its BMC cuts the power later)."""
        import libvirt

        minion_id = self.domain_minions.get(name)
        box_name = box.name if box is not None else None
        if not minion_id or (box is None and name in self.host_names):
            return
        try:
            with self._domain_lock(name):
                if self.home.get(name) != box_name or not self._active(name, box_name):
                    return
                self.minions.stop(minion_id, f"domain {name}: ACPI shutdown", grace=1.0)
                self._unmount(minion_id)
                conn = libvirt.open(self._uri(box_name))
                try:
                    conn.lookupByName(name).destroy()  # the guest's power off
                finally:
                    conn.close()
            log.info("domain %s: shut down cleanly (ACPI)", name)
        except Exception:
            log.exception("ACPI shutdown of %s failed", name)

    def _active(self, name: str, box_name: str | None = None) -> bool:
        """Does domain `name` run on that box's libvirtd (default: the shared one)? False:
        stopped, undefined, or the box is off."""
        import libvirt

        try:
            conn = libvirt.openReadOnly(self._uri(box_name))
        except libvirt.libvirtError:
            return False
        try:
            running = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
            return name in {dom.name() for dom in running}
        finally:
            conn.close()

    def _note_host(self, dom: Any) -> None:
        """Remember the store hosts' domains by name: a stopped domain's XML may be gone."""
        with contextlib.suppress(Exception):
            if host_of(dom.XMLDesc(0)) is not None:
                self.host_names.add(dom.name())

    def _watch_powerdown(self, uri: str, box: Box | None) -> Any:
        """QEMU's POWERDOWN events (the ACPI button pressed) on a connection of their own:
        libvirt refuses monitor events on a read-only one. None (logged) when it cannot."""
        import libvirt
        import libvirt_qemu

        def powerdown(_conn: Any, dom: Any, *_args: Any) -> None:
            threading.Thread(target=self._on_powerdown, args=(dom.name(), box),
                             daemon=True).start()

        try:
            conn = libvirt.open(uri)
            libvirt_qemu.qemuMonitorEventRegister(conn, None, "POWERDOWN", powerdown, None, 0)
            return conn
        except libvirt.libvirtError as exc:
            log.warning("no ACPI shutdown for simulated VMs (a shutdown ends in its hard "
                        "stop): %s", exc)
            return None

    def _lifecycle(self, dom: Any, event: int, detail: int, box: Box | None) -> None:
        """One lifecycle event of a libvirtd the simulator follows (`box`: a box's own)."""
        import libvirt

        action = event_action(event, detail)
        if action == "defined":
            self._note_host(dom)
        elif action == "boot":
            threading.Thread(target=self._on_domain_started, args=(dom, True, box),
                             daemon=True).start()
        elif action == "migrated-in":
            threading.Thread(target=self._rehome, args=(dom.name(), box), daemon=True).start()
        elif action == "migrated-out":
            threading.Thread(target=self._migrated_away, args=(dom.name(), box),
                             daemon=True).start()
        elif action == "stop":
            threading.Thread(target=self._on_domain_stopped, args=(dom.name(), box),
                             daemon=True).start()
        elif event == libvirt.VIR_DOMAIN_EVENT_STARTED:
            log.info("domain %s: an incoming migration starts on %s", dom.name(),
                     box.name if box is not None else "the shared libvirtd")

    def run_libvirt_events(self) -> None:
        import libvirt

        libvirt.virEventRegisterDefaultImpl()
        threading.Thread(target=self._event_loop, daemon=True, name="libvirt-loop").start()
        threading.Thread(target=self._follow_boxes, daemon=True, name="box-libvirtds").start()
        self._watch(self.info.libvirt_uri, None, self.stopping, False)

    def _watch(self, uri: str, box: Box | None, stop: threading.Event, fresh: bool) -> None:
        """Follow a libvirtd's lifecycle events until `stop` (or the simulator's stop);
        `fresh`: a box's libvirtd just started, whose running domains are booting."""
        import libvirt

        while not self.stopping.is_set() and not stop.is_set():
            try:
                conn = libvirt.openReadOnly(uri)
            except libvirt.libvirtError:
                if box is not None and not box.running():  # stopped by someone else
                    with self.lock:
                        if self.box_stops.get(box.name) is stop:
                            self.boxes.pop(box.name, None)
                            self.box_stops.pop(box.name, None)
                    return
                time.sleep(1)
                continue
            closed = threading.Event()
            conn.registerCloseCallback(lambda *_a, _closed=closed: _closed.set(), None)

            def lifecycle(_conn: Any, dom: Any, event: int, detail: int, _opaque: Any) -> None:
                self._lifecycle(dom, event, detail, box)

            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)

            monitor = self._watch_powerdown(uri, box)
            conn.setKeepAlive(5, 3)
            # domains already running when the simulator (re)starts get their minions back
            for dom in conn.listAllDomains():
                self._note_host(dom)
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                threading.Thread(target=self._on_domain_started, args=(dom, fresh, box),
                                 daemon=True).start()
            fresh = False  # a reconnect finds domains that were running already
            while not self.stopping.is_set() and not closed.is_set() and not stop.is_set():
                time.sleep(0.5)
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()
            if monitor is not None:
                with contextlib.suppress(libvirt.libvirtError):
                    monitor.close()

    @staticmethod
    def _event_loop() -> None:
        import libvirt

        while True:
            libvirt.virEventRunDefaultImpl()


def event_action(event: int, detail: int) -> str:
    """What a lifecycle event sets off: "boot" (a domain started, not by a migration), "stop"
    (stopped or shut down, not migrated away), "migrated-in" (a live migration ended here:
    the destination resumes the guest), "migrated-out" (the source's end), "defined", or ""
    (nothing: an incoming migration's start, a pause...)."""
    import libvirt

    if event == libvirt.VIR_DOMAIN_EVENT_DEFINED:
        return "defined"
    if event == libvirt.VIR_DOMAIN_EVENT_STARTED:
        return "" if detail == libvirt.VIR_DOMAIN_EVENT_STARTED_MIGRATED else "boot"
    if event == libvirt.VIR_DOMAIN_EVENT_RESUMED:
        return "migrated-in" if detail == libvirt.VIR_DOMAIN_EVENT_RESUMED_MIGRATED else ""
    if event == libvirt.VIR_DOMAIN_EVENT_STOPPED:
        return "migrated-out" if detail == libvirt.VIR_DOMAIN_EVENT_STOPPED_MIGRATED else "stop"
    if event == libvirt.VIR_DOMAIN_EVENT_SHUTDOWN:
        return "stop"
    return ""


def stop_counts(home: str | None, source: str | None) -> bool:
    """Does a stop reported by libvirtd `source` (a box's name; None: the shared one) stop the
    domain whose home is `home`? Only its home's does: a domain of the same name elsewhere (an
    incoming migration that failed, the source's copy after a move) is another machine's."""
    return home == source
