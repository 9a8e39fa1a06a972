"""VM boot: a libvirt lifecycle callback starts a salt-minion for each started domain with the
identity its seed disk gives (a domain whose disk holds a built image boots for real); a store
host's domain (lab/hardware.py) powering on or off goes to the firmware."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Protocol

from lab.hardware import host_of
from lab.simulator.faults import FaultKnobs
from lab.simulator.minions import MinionManager
from lab.state import LAB_IMAGE_BUILDS_DIR, LabInfo, LabPaths
from store_rollout.contracts import IDENTITY_SALT_DIR_ENV, IDENTITY_SEED_DIR_ENV, SEED_LABEL

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
        self.host_names: set[str] = set()
        self.hosts: StoreHosts | None = None  # the firmware, once it exists

    def domain_gone(self, minion_id: str) -> bool:
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

    def _on_domain_started(self, dom: Any, booting: bool = True) -> None:
        try:
            desc = dom.XMLDesc(0)
            if host_of(desc) is not None and self.hosts is not None:
                if booting:
                    self.hosts.host_powered_on(dom.name())
                else:
                    self.hosts.host_running(dom.name())
                return
            xml = ET.fromstring(desc)
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
                from lab.image_builder import render_minion_d

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
        from lab.image_builder import LabBuilder

        lab_family = LabBuilder.tag.rsplit("-", 1)[0] + "-"  # "lab-"
        return not str(self._base_meta(xml).get("builder", "")).startswith(lab_family)

    def _image_meta(self, xml: ET.Element) -> tuple[Path, dict[str, str]]:
        """The KIWI description and build parameters of the image this domain's disk is an
        overlay of (from the base image's meta.json)."""
        from tasks.kiwi import resolve_description

        meta = self._base_meta(xml)
        # meta.json names the description, not its directory: the lab's own are under lab/
        lab_own = LAB_IMAGE_BUILDS_DIR / meta["description"]
        desc_dir = lab_own if lab_own.is_dir() else resolve_description(meta["description"])
        return desc_dir, meta.get("params", {})

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
        if name in self.host_names and self.hosts is not None:
            self.hosts.host_powered_off(name)
            return
        minion_id = self.domain_minions.get(name)
        if minion_id:
            # a destroyed domain is a power cut: the guest gets no grace in which its minion
            # could re-authenticate after a rollback deleted its key (as CI saw once)
            self.minions.stop(minion_id, f"domain {name} stopped", grace=0.0)

    def _note_host(self, dom: Any) -> None:
        """Remember the store hosts' domains by name: a stopped domain's XML may be gone."""
        with contextlib.suppress(Exception):
            if host_of(dom.XMLDesc(0)) is not None:
                self.host_names.add(dom.name())

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
                if event == libvirt.VIR_DOMAIN_EVENT_DEFINED:
                    self._note_host(dom)
                elif event == libvirt.VIR_DOMAIN_EVENT_STARTED:
                    threading.Thread(target=self._on_domain_started, args=(dom,),
                                     daemon=True).start()
                elif event in (libvirt.VIR_DOMAIN_EVENT_STOPPED,
                               libvirt.VIR_DOMAIN_EVENT_SHUTDOWN):
                    threading.Thread(target=self._on_domain_stopped, args=(dom.name(),),
                                     daemon=True).start()

            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)
            conn.setKeepAlive(5, 3)
            # domains already running when the simulator (re)starts get their minions back
            for dom in conn.listAllDomains():
                self._note_host(dom)
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                threading.Thread(target=self._on_domain_started, args=(dom, False),
                                 daemon=True).start()
            while not self.stopping.is_set() and not closed.is_set():
                time.sleep(0.5)
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    @staticmethod
    def _event_loop() -> None:
        import libvirt

        while True:
            libvirt.virEventRunDefaultImpl()
