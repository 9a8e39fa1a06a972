"""What a store host's firmware does when its BMC powers its domain on or off (lab/hardware.py,
lab/bmc_service.py), and every machine's reboot.

Full lab: the domain boots for real (lab/netboot.py: iPXE, DHCP and TFTP from Cobbler's dnsmasq,
PXELINUX, the lab's installer); the firmware here only watches the host's serial console, and
once the host boots from its disk it runs the installed host from the files on that disk.
Default lab: the domain cannot boot, and the firmware here plays the PXE boot: it fetches the
per-MAC PXELINUX configuration over TFTP from the store network; if that says install, it
fetches the profile it names from Cobbler over HTTP (AutoYaST's `autoyast=`, Agama's
`inst.auto=`), reads it by what Cobbler served (XML or JSON), lays down the files it writes and
calls Cobbler's nopxe, as the installer does; if it says localboot, it boots the installed host.
The installed host's minion runs the Salt its platform's host runs (lab/state.py
PLATFORM_SALT_BIN), by the platform its profile names."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from lab import box_libvirt
from lab.agama import parse_profile
from lab.boxes import Box, own_box, power_cut, power_on, wipe
from lab.hardware import host_of, remove_domain, smbios_serial, store_domains
from lab.netboot import DISK_BOOT_MARKER, INSTALL_ID_FILE, host_files, read_install
from lab.simulator.faults import FaultKnobs
from lab.simulator.installed_host import installed_minion
from lab.simulator.minions import MinionManager
from lab.state import HOST_PY36_SALT_BIN, PLATFORM_OS_GRAINS, PLATFORM_SALT_BIN, LabInfo, LabPaths

if TYPE_CHECKING:
    from lab.simulator.vm_boot import VmBoot

log = logging.getLogger("lab.simulator")

# the profile URL on an install's kernel command line: AutoYaST's option, Agama's
PROFILE_OPTION_RE = re.compile(r"(?:^|\s)(?:autoyast|inst\.auto)=(\S+)")


# curl's exit status for a file the TFTP server does not have
CURL_TFTP_NOT_FOUND = 68
CONSOLE_POLL_SECONDS = 0.25

# what the installer's curl does; run on the store network (StoreNetwork.run)
_FETCH = ("import sys, urllib.request\n"
          "with urllib.request.urlopen(sys.argv[1], timeout=30) as r:\n"
          "    sys.stdout.write(r.read().decode())")


def box_minion_d(files: dict[str, str], shared_uri: str, box_uri: str) -> dict[str, str]:
    """A box's minion.d as its install wrote it, with its own libvirtd's URI where the profile
    named the lab's shared one (the `virt` connection and the libvirt events engine), as
    Cobbler would have rendered it with the box's URI."""
    return {name: text.replace(shared_uri, box_uri) for name, text in files.items()}


def box_minion_config(box: Box) -> dict[str, Any]:
    """What a box's minion config adds: its libvirtd, and storevirt's PKI dir (the box's, as
    its minion sees it) and how the box's libvirtd rereads its TLS files."""
    return {"virt": {"connection": {"uri": box.uri}},
            "storevirt": {"pki_dir": str(box.pki),
                          "tls_reload": box_libvirt.reload_tls_argv(box.dir)}}


def box_domains(box: Box, active: bool) -> list[Any]:
    """Every domain of a box's own libvirtd (`active`: the running ones)."""
    import libvirt

    conn = libvirt.open(box.uri)
    flag = libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE if active else 0
    return list(conn.listAllDomains(flag))


class Firmware:
    """The store hosts' firmware, and every machine's reboot."""

    def __init__(self, paths: LabPaths, info: LabInfo, faults: FaultKnobs,
                 minions: MinionManager, vms: VmBoot) -> None:
        self.paths = paths
        self.info = info
        self.faults = faults
        self.minions = minions
        self.vms = vms

    def host_powered_on(self, system_name: str) -> None:
        """A store host's domain started (its BMC powered it on): it boots, from the network
        while Cobbler's netboot is on for it, else from its disk."""
        boot = self._watch_console if self.info.full else self._boot_system
        threading.Thread(target=boot, args=(system_name,), daemon=True,
                         name=f"boot-{system_name}").start()

    def host_powered_off(self, system_name: str) -> None:
        """A store host's domain stopped: its OS stops at once, its store's VMs with it."""
        self._stop_system(system_name)

    def host_running(self, system_name: str) -> None:
        """A host found on when the simulator starts: its installed OS runs on (no boot; a box
        whose own libvirtd is gone boots it again)."""
        minion_id = self._system_minion(system_name)
        if minion_id and self.minions.installed(minion_id):
            self._os_up(system_name, minion_id, f"{system_name} is on", autostart=False)

    def _box(self, system_name: str) -> Box | None:
        """The host's own libvirtd box (racked `own_libvirt`), else None: the lab's shared one."""
        return own_box(self.paths.root, system_name, self.info.vm_images_dir)

    def _os_up(self, system_name: str, minion_id: str, reason: str, autostart: bool) -> None:
        """The installed OS runs: a box's own libvirtd first (in the box's network namespace,
        which its minion joins), then its minion; `autostart`: a boot, whose libvirt starts the
        domains marked autostart."""
        box = self._box(system_name)
        if box is not None:
            with self.vms.box_power(box):
                started = power_on(box, network=self.minions.network(), minion_id=minion_id,
                                   address=self.minions.address(minion_id),
                                   simulator_url=self.minions.network().url(
                                       self.minions.simulator_port),
                                   logs=self.paths.logs)
                self.vms.box_on(box, fresh=started)
        self.minions.start(minion_id, reason)
        if autostart:
            self._autostart_domains(system_name)

    def _system_minion(self, system_name: str) -> str | None:
        marker = self.paths.simulator / "systems" / f"{system_name}.minion"
        return marker.read_text().strip() if marker.exists() else None

    def _stop_system(self, system_name: str) -> None:
        """Power off: the host's OS stops at once, its minion and its store's domains with it."""
        minion_id = self._system_minion(system_name)
        if minion_id:
            self.minions.stop(minion_id, f"power off {system_name}", grace=0.0)
        box = self._box(system_name)
        if box is not None:  # its VMs' minions at once, no write-back; then its libvirtd
            with self.vms.box_power(box):
                self.vms.box_off(box)
                power_cut(box)
            log.info("power off %s: its libvirtd and domains stop", system_name)
            return
        for dom in self._host_domains(system_name, active=True):
            with contextlib.suppress(Exception):  # gone meanwhile: nothing left to stop
                dom.destroy()
                log.info("power off %s: its domain %s stops", system_name, dom.name())

    def _host_domains(self, system_name: str, active: bool) -> list[Any]:
        """The domains that run on this store host: a box's own libvirtd's (none while the box
        is off), else those of the lab's shared libvirtd seeded with its store's identity."""
        box = self._box(system_name)
        if box is not None:
            return box_domains(box, active) if box.running() else []
        marker = self.paths.simulator / "systems" / f"{system_name}.store"
        if not marker.exists():
            return []
        return store_domains(self.info, marker.read_text().strip(), active)

    def _wipe_disk(self, system_name: str) -> None:
        """An install formats the host's disk: the store VMs defined on it and their disks are
        gone (the base images in the lab's shared images dir are every host's: kept; a box
        with its own libvirtd loses its images, libvirt state and keys)."""
        box = self._box(system_name)
        if box is not None:
            wipe(box)
            log.info("install of %s wipes its disk: its libvirt, images and keys", system_name)
            return
        for dom in self._host_domains(system_name, active=False):
            log.info("install of %s wipes its disk: domain %s and %d disk files gone",
                     system_name, *remove_domain(self.info, dom))

    def _autostart_domains(self, system_name: str) -> None:
        """What the host's libvirt does at boot: start its domains marked autostart."""
        for dom in self._host_domains(system_name, active=False):
            with contextlib.suppress(Exception):
                if dom.autostart() and not dom.isActive():
                    dom.create()
                    log.info("%s boots: autostart domain %s started", system_name, dom.name())

    def _pxe_config(self, mac: str) -> str | None:
        """PXELINUX's per-MAC configuration, over TFTP from the store network's server (the
        DHCP answer's next-server: the gateway), as PXELINUX asks for it; None if there is
        none."""
        network = self.minions.network()
        name = "01-" + mac.lower().replace(":", "-")
        proc = network.run(["curl", "-sS", "--max-time", "10",
                            f"tftp://{network.gateway}/pxelinux.cfg/{name}"],
                           capture_output=True, text=True, timeout=30)
        if proc.returncode == CURL_TFTP_NOT_FOUND:
            return None
        if proc.returncode != 0:
            raise RuntimeError(f"firmware: TFTP pxelinux.cfg/{name} from {network.gateway} "
                               f"failed: {proc.stderr.strip()}")
        return proc.stdout

    # -- the full lab: a real network boot -------------------------------------------------
    def _watch_console(self, system_name: str) -> None:
        """Follow the host's serial console from power on: the installer's messages go to the
        simulator's log; the boot sector's line means the host booted from its disk."""
        try:
            self._stop_system(system_name)  # a power cycle kills the running OS
            console = host_files(self.info, system_name).console
            offset = console.stat().st_size if console.exists() else 0
            pending = ""
            while self._host_on(system_name):
                with console.open("rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                offset += len(chunk)
                pending += chunk.decode(errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    if "store-installer:" in line:
                        log.info("%s console: %s", system_name, line.strip())
                    if DISK_BOOT_MARKER in line:
                        self._boot_from_disk(system_name)
                        return
                time.sleep(CONSOLE_POLL_SECONDS)
        except Exception:
            log.exception("boot of %s failed", system_name)

    def _host_on(self, system_name: str) -> bool:
        import libvirt

        conn = libvirt.openReadOnly(self.info.libvirt_uri)
        try:
            return any(dom.name() == system_name and dom.isActive()
                       for dom in conn.listAllDomains())
        finally:
            conn.close()

    def _boot_from_disk(self, system_name: str) -> None:
        """The installed host runs: from the files the installer wrote to the disk, applied
        once per install (a reboot of the same install keeps the minion's keys)."""
        files = read_install(host_files(self.info, system_name).disk)
        if files is None:
            log.warning("%s booted from a disk without an install", system_name)
            return
        install_id = files.get(INSTALL_ID_FILE, "").strip()
        record = self.paths.simulator / "systems" / f"{system_name}.install"
        if not record.exists() or record.read_text() != install_id:
            self._lay_down(system_name, {f"/{path}": text for path, text in files.items()})
            record.write_text(install_id)
        minion_id = self._system_minion(system_name)
        if minion_id:
            self._os_up(system_name, minion_id, f"{system_name} boots from disk", autostart=True)

    def _boot_system(self, system_name: str) -> None:
        try:
            self._stop_system(system_name)  # a power cycle kills the running OS
            # the firmware asks for its own NIC's PXE configuration, whatever record holds it
            pxe = self._pxe_config(self._box_mac(system_name))
            match = PROFILE_OPTION_RE.search(pxe or "")
            if match:
                self._install(system_name, match.group(1))
            else:
                minion_id = self._system_minion(system_name)
                if minion_id and self.minions.installed(minion_id):
                    self._os_up(system_name, minion_id, f"{system_name} boots from disk",
                                autostart=True)
                else:
                    log.warning("%s: no PXE config and no installed OS", system_name)
        except Exception:
            log.exception("boot of %s failed", system_name)

    def _install(self, system_name: str, profile_url: str) -> None:
        delay, fail = self.faults.take("pxe", system_name)
        if delay:
            time.sleep(delay)
        if fail:
            log.warning("fault knob: install of %s fails", system_name)
            return
        rendered = parse_profile(self._fetch(profile_url))
        self._wipe_disk(system_name)
        minion_id = self._lay_down(system_name, rendered.files, rendered.installer)
        # end of install (the profile's last script): tell Cobbler, so netboot turns off; the
        # URL is the one Cobbler rendered (the profile's http_server carries the port)
        if rendered.nopxe_url:
            self._nopxe(rendered.nopxe_url)
        self._os_up(system_name, minion_id, f"{system_name} installed from {profile_url}",
                    autostart=False)

    def _lay_down(self, system_name: str, files: dict[str, str],
                  installer: str | None = None) -> str:
        """The installed host's minion from the files its install wrote (absolute path ->
        text), running its platform's Salt; `installer`: whose profile wrote them (None: the
        full lab's disk, judged by the files). Returns its id."""
        host = installed_minion(files, installer, fallback_id=system_name)
        minion_id = host.minion_id
        (self.paths.simulator / "systems").mkdir(parents=True, exist_ok=True)
        (self.paths.simulator / "systems" / f"{system_name}.minion").write_text(minion_id)
        store_id = str(host.grains.get("store_id", ""))
        (self.paths.simulator / "systems" / f"{system_name}.store").write_text(store_id)
        # the virt URI and images dir come from the profile (Cobbler's autoinstall_meta), as on
        # a real host: the lab adds nothing there
        extra: dict[str, Any] = {}
        if self.faults.take("startup_highstate", system_name, minion_id)[1]:
            # the installed host comes up without its first highstate (lost or crashed run)
            log.warning("fault knob: %s starts without its startup highstate", system_name)
            extra["startup_states"] = ""
        # the Salt its platform's host runs: a sles15-xen host SUSE's 3006 (built-in virt
        # module), on request its unpatched GA 3006.0 on Python 3.6, whose auth protocol 2 the
        # master refuses (the knob is only taken by a host it applies to); a sle16-kvm host the
        # Salt Bundle's stand-in. The extension modules the profile writes (the libvirt events
        # engine) go where that minion looks for them: its root_dir stands for "/"
        salt_bin = PLATFORM_SALT_BIN.get(host.platform)
        if salt_bin is None:
            raise RuntimeError(f"installer: {system_name}'s profile names platform "
                               f"{host.platform!r} (grain store_rollout_platform); the lab runs "
                               f"a host of {', '.join(PLATFORM_SALT_BIN)}")
        if host.platform == "sles15-xen" and self.faults.take(
                "old_host_salt", system_name, minion_id)[1]:
            log.warning("fault knob: %s runs Salt 3006.0 on Python 3.6", system_name)
            salt_bin = HOST_PY36_SALT_BIN
        log.info("%s: a %s host, its minion %s runs %s", system_name, host.platform, minion_id,
                 salt_bin)
        box = self._box(system_name)
        minion_d = host.minion_d
        if box is not None:
            minion_d = box_minion_d(minion_d, self.info.libvirt_uri, box.uri)
            extra.update(box_minion_config(box))
        self.minions.install(minion_id, minion_d, extra, salt_bin=salt_bin,
                             store_host=True, disk_files=host.extmods,
                             smbios_serial=self._smbios_serial(system_name),
                             os_grains=PLATFORM_OS_GRAINS.get(host.platform), box=box)
        return minion_id

    def _box_mac(self, system_name: str) -> str:
        """The MAC of the box's PXE NIC (its domain's, as racked)."""
        import libvirt

        conn = libvirt.openReadOnly(self.info.libvirt_uri)
        try:
            box = host_of(conn.lookupByName(system_name).XMLDesc(0))
        finally:
            conn.close()
        if box is None:
            raise RuntimeError(f"firmware: {system_name} is not a racked store host")
        return box["mac"]

    def _smbios_serial(self, system_name: str) -> str | None:
        """The serial the machine's firmware reports (its domain's SMBIOS system entry)."""
        import libvirt

        conn = libvirt.openReadOnly(self.info.libvirt_uri)
        try:
            return smbios_serial(conn.lookupByName(system_name).XMLDesc(0))
        finally:
            conn.close()

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
        # no grace: salt-minion takes about 6 s to leave on SIGTERM, so a grace only delayed
        # the SIGKILL it ended in anyway
        self.minions.stop(minion_id, "reboot", grace=0.0)
        delay, fail = self.faults.take("reboot", minion_id)
        time.sleep(0.5 + delay)  # powered off
        if fail:
            log.warning("fault knob: %s does not come back after reboot", minion_id)
            return
        if self.vms.domain_gone(minion_id):
            log.info("%s: its domain was stopped or removed during the reboot; stays down",
                     minion_id)
            return
        self.minions.start(minion_id, "reboot")
