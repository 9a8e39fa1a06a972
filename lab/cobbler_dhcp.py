"""The store network's DHCP and TFTP server, as Cobbler manages it: `manage_dhcp` with its
dnsmasq module writes /etc/dnsmasq.conf (from the lab's template) and /etc/ethers on every
sync, and dnsmasq serves Cobbler's TFTP tree (/srv/tftpboot: PXELINUX, the per-MAC
configurations, the distro's kernel and initrd).

dnsmasq runs where Cobbler's files are and where the store hosts are: in cobblerd's mount
namespace (the overlays of lab/cobbler_service.py) and on the store network (the gateway's
network namespace, lab/store_network.py), so it reads exactly what Cobbler wrote and answers
only on the store network's bridge. It logs every DHCP exchange and every file TFTP sends.

Cobbler restarts its DHCP service through the host's init system (`restart_dhcp`); the lab's
dnsmasq is no service of this machine, so that stays off and a sync/post trigger (the
extension point Cobbler runs after each sync, a one-system sync too) sends dnsmasq SIGHUP
instead: it reads /etc/ethers and Cobbler's hosts file again, the MAC -> address of each
system.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lab import procs
from lab.cobbler_service import CobblerLabConfig
from lab.netboot import LDLINUX, PXELINUX
from lab.procs import ProcessRecord
from lab.store_network import BRIDGE, DHCP_FIRST, DHCP_LAST, NETWORK, StoreNetwork

TEMPLATE_SOURCE = Path(__file__).resolve().parent / "cobbler_dnsmasq.template"
RELOAD_TRIGGER = "lab-reload-dnsmasq"
# what the lab turns on in Cobbler's settings.yaml for it (restart_dhcp: see above)
SETTINGS = {"manage_dhcp": "true", "manage_dhcp_v4": "true", "restart_dhcp": "false"}


def pid_file(cfg: CobblerLabConfig) -> Path:
    return cfg.state_dir / "dnsmasq.pid"


def template_text() -> str:
    """The lab's dnsmasq template, with the store network's bridge and range filled in."""
    return (TEMPLATE_SOURCE.read_text()
            .replace("@BRIDGE@", BRIDGE)
            .replace("@DHCP_RANGE@", f"{DHCP_FIRST},{DHCP_LAST},{NETWORK.netmask},1h"))


def prepare(cfg: CobblerLabConfig) -> None:
    """Cobbler's side: the dnsmasq module, the template, the BIOS loaders its sync copies into
    the TFTP tree, and the reload trigger (lab/cobbler_service.py makes the rest)."""
    etc = cfg.upper("etc") / "cobbler"
    modules = etc / "modules.conf"
    text = modules.read_text()
    modules.write_text(text.replace("[dhcp]\nmodule = managers.isc",
                                    "[dhcp]\nmodule = managers.dnsmasq"))
    if "module = managers.dnsmasq" not in modules.read_text():
        raise RuntimeError(f"{modules}: no [dhcp] section to point at managers.dnsmasq")
    (etc / "dnsmasq.template").write_text(template_text())
    loaders = cfg.upper("var") / "lib" / "cobbler" / "loaders"
    loaders.mkdir(parents=True, exist_ok=True)
    for loader in (PXELINUX, LDLINUX):
        if not loader.exists():
            raise FileNotFoundError(f"{loader} is missing: run `make setup`")
        shutil.copyfile(loader, loaders / loader.name)
    trigger = cfg.upper("var") / "lib" / "cobbler" / "triggers" / "sync" / "post" / RELOAD_TRIGGER
    trigger.parent.mkdir(parents=True, exist_ok=True)
    trigger.write_text(
        "#!/bin/sh\n"
        "# the lab's dnsmasq reads /etc/ethers and Cobbler's hosts file again (lab/cobbler_dhcp.py)\n"
        f"pid=$(cat '{pid_file(cfg)}' 2>/dev/null) && kill -HUP \"$pid\" 2>/dev/null\n"
        "exit 0\n")
    os.chmod(trigger, 0o755)


def start(cfg: CobblerLabConfig, cobblerd: ProcessRecord, network: StoreNetwork,
          log: Path) -> ProcessRecord:
    """dnsmasq in cobblerd's mount namespace, on the store network. Cobbler must have synced
    once (it writes /etc/dnsmasq.conf)."""
    fd = network.open_namespace()  # checks the gateway is the one that made the network
    os.close(fd)
    argv = ["nsenter", "-t", str(cobblerd.pid), "-m", f"--net=/proc/{network.pid}/ns/net",
            "dnsmasq", "--keep-in-foreground", "--conf-file=/etc/dnsmasq.conf",
            f"--pid-file={pid_file(cfg)}",
            f"--dhcp-leasefile={cfg.state_dir / 'dnsmasq.leases'}",
            "--user=root", "--group=root", "--log-facility=-"]
    pid_file(cfg).unlink(missing_ok=True)
    return procs.spawn(argv, log)


def wait_ready(cfg: CobblerLabConfig, record: ProcessRecord) -> None:
    """dnsmasq writes its pid file once it has read its configuration and bound its sockets."""

    def started() -> bool:
        if not record.alive():
            raise RuntimeError("dnsmasq exited at start: see its log (a configuration Cobbler "
                               "wrote that it refuses, or its ports taken)")
        return pid_file(cfg).exists()

    procs.wait_until(started, 10, "the store network's dnsmasq")
