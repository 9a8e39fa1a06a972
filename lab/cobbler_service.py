"""A real cobblerd 3.3.10 for the lab, fully contained in one state directory.

Cobbler hard-codes its paths (/etc/cobbler, /var/lib/cobbler, /srv/tftpboot, /usr/sbin/fence_*;
the lab installs no fence agent: step 2 drives the BMCs itself, lab/bmc_service.py),
so cobblerd runs in a private mount namespace with overlays on /etc, /var, /srv and /usr/sbin whose
upper dirs live in the state dir: every write lands there, the host sees nothing, and the mounts
vanish with the last process in the namespace.  See /work/shared/notes/cobbler.md.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import stat
import time
import urllib.request
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import procs
from lab.procs import ProcessRecord
from lab.state import IMAGE_BUILDS_DIR, SALT_STATES_DIR
from store_rollout.contracts import LIBVIRT_EVENTS_ENGINE
from store_rollout.platforms import PLATFORMS

LAB_DIR = Path(__file__).resolve().parent
SVC_HTTP_SRC = LAB_DIR / "cobbler_svc_http.py"

DISTRO = "leap-15.6-x86_64"
DISTRO_OS_VERSION = "opensuse15.6"  # a key of breeds.suse in 3.3.10's distro_signatures.json
# Agama's distro: breed suse with an os_version outside tftpgen's `suse_yast` list, so Cobbler
# itself puts `inst.auto=<the system's autoinstall URL>` on the kernel line (and, with meta
# `tree`, Agama's live root `root=live:<tree>/LiveOS/squashfs.img`) instead of `autoyast=`.
# 3.3.10's signatures have no SLES 16: opensuse16.0 is the os_version both products' Agama boots
# with (the kernel and initrd are the distro's: the live ISO's in production, the lab's installer
# here)
AGAMA_DISTRO = "sle16-x86_64"
AGAMA_DISTRO_OS_VERSION = "opensuse16.0"
# each installer's distro: (name, os_version)
DISTROS = {"autoyast": (DISTRO, DISTRO_OS_VERSION),
           "agama": (AGAMA_DISTRO, AGAMA_DISTRO_OS_VERSION)}
# each platform's profile, serving its template (store_rollout/platforms.py, image_builds/)
PROFILES = {p.cobbler_profile: p for p in PLATFORMS.values()}
PROFILE = PLATFORMS["sles15-xen"].cobbler_profile
TEMPLATE = Path(PLATFORMS["sles15-xen"].template).name
# the installer's messages on the host's serial console (the full lab keeps it in a file); Agama:
# the NICs named ethN as the installed system names them (the profile's bootloader option), so
# its network connections, named by Cobbler's interface, are the same NIC in both
KERNEL_OPTIONS = {"autoyast": "console=ttyS0", "agama": "console=ttyS0 net.ifnames=0"}
# the snippet the profile writes into the hypervisor minion's extension modules: the libvirt
# events engine, so the minion's first start runs it (docs/production.md, row 15)
ENGINE_SNIPPET = f"{LIBVIRT_EVENTS_ENGINE}.py"
ENGINE_SOURCE = SALT_STATES_DIR / "_engines" / ENGINE_SNIPPET

# state-dir name -> host path it overlays
OVERLAYS = {"etc": "/etc", "var": "/var", "srv": "/srv", "usr-sbin": "/usr/sbin"}

# DHCP (v4) through the dnsmasq module: the store network's DHCP and TFTP server reads what
# Cobbler writes (lab/cobbler_dhcp.py), which reloads it with a trigger instead of restarting a
# service of this machine; no DNS, rsync or in.tftpd daemon; pxe_just_once makes nopxe flip
# netboot.
SETTINGS = {
    "manage_dhcp": "true",
    "manage_dhcp_v4": "true",
    "manage_dhcp_v6": "false",
    "manage_dns": "false",
    "manage_tftpd": "false",
    "manage_rsync": "false",
    "restart_dns": "false",
    "restart_dhcp": "false",
    "pxe_just_once": "true",
}

COLLECTIONS = ("distros", "profiles", "systems", "images", "repos", "mgmtclasses", "packages",
               "files", "menus")
TRIGGER_ITEMS = ("distro", "profile", "system", "repo", "image", "mgmtclass", "package", "file",
                 "menu")
WWW_SUBDIRS = ("distro_mirror", "images", "links", "localmirror", "pub", "rendered",
               "repo_mirror", "repo_profile", "repo_system")


@dataclass(frozen=True)
class CobblerLabConfig:
    state_dir: Path
    venv: Path
    xmlrpc_port: int
    http_port: int
    user: str
    password: str
    server_address: str = "127.0.0.1"  # Cobbler's `server`: the address installers fetch from

    def upper(self, name: str) -> Path:
        """Overlay upper dir for a key of OVERLAYS, e.g. upper("srv") / "tftpboot"."""
        return self.state_dir / name / "u"

    @property
    def xmlrpc_url(self) -> str:
        return f"http://127.0.0.1:{self.xmlrpc_port}/"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"


def _site_packages(venv: Path) -> Path:
    # The venv's own python version, not ours: glob instead of sysconfig.
    found = sorted(venv.glob("lib/python3*/site-packages/cobbler"))
    if not found:
        raise FileNotFoundError(f"cobbler is not installed in {venv}")
    return found[-1].parent


def _populate_overlays(cfg: CobblerLabConfig) -> None:
    """mkstate.sh from the notes: the wheel ships etc/var/www trees, the rest is empty dirs."""
    sp = _site_packages(cfg.venv)
    etc, var, srv = cfg.upper("etc"), cfg.upper("var"), cfg.upper("srv")
    if not (etc / "cobbler").exists():
        shutil.copytree(sp / "etc" / "cobbler", etc / "cobbler", symlinks=True)
    lib = var / "lib" / "cobbler"
    if not lib.exists():
        shutil.copytree(sp / "var" / "lib" / "cobbler", lib, symlinks=True)
    www = var / "www" / "cobbler"
    if not www.exists():
        shutil.copytree(sp / "var" / "www" / "cobbler", www, symlinks=True)
    dirs = [var / "log" / "cobbler" / d for d in ("tasks", "anamon", "kicklog", "syslog")]
    dirs += [var / "cache" / "cobbler", srv / "tftpboot", lib / "loaders", lib / "jinja2",
             lib / "kickstarts"]
    dirs += [lib / "collections" / c for c in COLLECTIONS]
    for op in ("add", "delete"):
        dirs += [lib / "triggers" / op / i / t for i in TRIGGER_ITEMS for t in ("pre", "post")]
    dirs += [lib / "triggers" / t for t in ("install/pre", "install/post", "sync/pre",
                                             "sync/post", "change", "task")]
    dirs += [www / d for d in WWW_SUBDIRS]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)


def _edit_settings(path: Path, values: dict[str, str]) -> None:
    # Line edits instead of a YAML round trip: keeps the stock file's comments and key order.
    text = path.read_text()
    for key, value in values.items():
        pattern = re.compile(rf"^{re.escape(key)}:.*$", re.MULTILINE)
        line = f"{key}: {value}"
        if pattern.search(text):
            text = pattern.sub(line.replace("\\", "\\\\"), text, count=1)
        else:
            text = text.rstrip("\n") + f"\n{line}\n"
    path.write_text(text)


def prepare_state(cfg: CobblerLabConfig) -> None:
    """Create or refresh the state dir; items already stored in the collections are kept."""
    state = cfg.state_dir.resolve()
    if any(c in str(state) for c in ",:"):
        raise ValueError(f"state dir {state} must not contain ',' or ':' (overlay mount options)")
    for lower in OVERLAYS.values():
        # A state dir below an overlaid tree would be its own lower dir.
        if state == Path(lower) or Path(lower) in state.parents:
            raise ValueError(f"state dir {state} must be outside {lower}")
    for name, lower in OVERLAYS.items():
        upper, work = cfg.upper(name), cfg.state_dir / name / "w"
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        # The upper root's mode becomes the mount point's mode, e.g. tmp_path dirs are 0700.
        upper.chmod(stat.S_IMODE(os.stat(lower).st_mode))
    _populate_overlays(cfg)
    _edit_settings(
        cfg.upper("etc") / "cobbler" / "settings.yaml",
        {**SETTINGS, "server": cfg.server_address, "next_server_v4": cfg.server_address,
         "xmlrpc_port": str(cfg.xmlrpc_port), "http_port": str(cfg.http_port)},
    )
    # Only the lab user: the stock cobbler/cobbler account must not work in the lab.
    digest = hashlib.sha3_512(cfg.password.encode()).hexdigest()
    (cfg.upper("etc") / "cobbler" / "users.digest").write_text(f"{cfg.user}:Cobbler:{digest}\n")
    (cfg.state_dir / "boot").mkdir(exist_ok=True)
    cfg.log_dir.mkdir(exist_ok=True)


def _mount_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _overlays_mounted(record: ProcessRecord) -> bool:
    if not record.alive():
        raise RuntimeError("cobblerd exited during startup")
    if _mount_namespace(record.pid) == _mount_namespace(os.getpid()):
        return False  # still `unshare` before the unshare(2) call
    mountinfo = Path(f"/proc/{record.pid}/mountinfo").read_text()
    targets = {line.split()[4] for line in mountinfo.splitlines() if " - overlay " in line}
    return set(OVERLAYS.values()) <= targets


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start(cfg: CobblerLabConfig) -> dict[str, ProcessRecord]:
    """Start cobblerd in its own mount namespace and the HTTP side inside that namespace."""
    mounts = "; ".join(
        "mount -t overlay overlay -o "
        + shlex.quote(
            f"lowerdir={lower},upperdir={cfg.upper(name).resolve()},"
            f"workdir={(cfg.state_dir / name / 'w').resolve()}"
        )
        + f" {lower}"
        for name, lower in OVERLAYS.items()
    )
    cobblerd = shlex.quote(str(cfg.venv / "bin" / "cobblerd"))
    # exec chain (unshare -> bash -> cobblerd): the spawned PID ends up being cobblerd itself.
    argv = ["unshare", "-m", "--propagation", "private", "/bin/bash", "-c",
            f"set -e; {mounts}; exec {cobblerd} -F"]
    cobblerd_log = cfg.log_dir / "cobblerd.log"
    cobblerd_rec = procs.spawn(argv, cobblerd_log)
    try:
        # nsenter must not run before unshare(2) and the mounts, or it joins the host namespace.
        procs.wait_until(lambda: _overlays_mounted(cobblerd_rec), 10, "cobblerd mount namespace")
        http_argv = ["nsenter", "-t", str(cobblerd_rec.pid), "-m",
                     str(cfg.venv / "bin" / "python"), str(SVC_HTTP_SRC), str(cfg.http_port)]
        http_rec = procs.spawn(http_argv, cfg.log_dir / "cobbler-http.log")
    except Exception as exc:
        procs.stop(cobblerd_rec)
        raise RuntimeError(f"cobblerd failed to start: {exc}\n{_log_tail(cobblerd_log)}") from exc
    return {"cobblerd": cobblerd_rec, "cobbler-http": http_rec}


def stop(records: dict[str, ProcessRecord]) -> None:
    """Stop the HTTP side first (it keeps the namespace alive too), then cobblerd."""
    for name in ("cobbler-http", "cobblerd"):
        if name in records:
            procs.stop(records[name])


def server(cfg: CobblerLabConfig) -> xmlrpc.client.ServerProxy:
    return xmlrpc.client.ServerProxy(cfg.xmlrpc_url, allow_none=True)


def login(cfg: CobblerLabConfig) -> tuple[xmlrpc.client.ServerProxy, str]:
    proxy = server(cfg)
    return proxy, str(proxy.login(cfg.user, cfg.password))


def wait_ready(cfg: CobblerLabConfig, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    procs.wait_until(lambda: login(cfg)[1], timeout, "cobblerd XML-RPC login")

    def http_answers() -> bool:
        # list goes HTTP -> svc -> XML-RPC, so it proves the whole chain, not just the socket.
        url = f"{cfg.http_url}/cblr/svc/op/list/what/profiles"
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)

    procs.wait_until(http_answers, max(deadline - time.monotonic(), 1), "cobbler-http svc")


def _upsert(
    proxy: xmlrpc.client.ServerProxy,
    token: str,
    what: str,
    name: str,
    fields: list[tuple[str, Any]],
) -> None:
    """Create the item or update it in place, so seeding twice leaves one item."""
    if proxy.get_item(what, name) == "~":  # 3.3.10's "missing" marker
        handle = proxy.new_item(what, token)
        proxy.modify_item(what, handle, "name", name, token)
    else:
        handle = proxy.get_item_handle(what, name, token)
    for attribute, value in fields:  # order matters: e.g. breed before os_version
        if not proxy.modify_item(what, handle, attribute, value, token):
            raise RuntimeError(f"cobbler refused {what} {name}: {attribute}={value!r}")
    proxy.save_item(what, handle, token)


def seed(cfg: CobblerLabConfig, kernel: Path, initrd: Path) -> None:
    """A distro per installer (both the lab's installer: lab/netboot.py), each platform's
    autoinstall template (and the engine snippet they read) and profile for store hypervisors
    (idempotent), then a full sync: the TFTP tree and the DHCP configuration the store network's
    dnsmasq starts from."""
    proxy, token = login(cfg)
    for distro, os_version in DISTROS.values():
        _upsert(proxy, token, "distro", distro, [
            ("arch", "x86_64"),
            ("breed", "suse"),
            ("os_version", os_version),
            ("kernel", str(kernel.resolve())),
            ("initrd", str(initrd.resolve())),
        ])
    # as an operator installs it in production: the engine module itself is the snippet
    proxy.write_autoinstall_snippet(ENGINE_SNIPPET, ENGINE_SOURCE.read_text(), token)
    for profile, platform in PROFILES.items():
        template = Path(platform.template).name
        proxy.write_autoinstall_template(
            template, (IMAGE_BUILDS_DIR / platform.template).read_text(), token)
        _upsert(proxy, token, "profile", profile, [
            ("distro", DISTROS[platform.installer][0]), ("autoinstall", template),
            ("kernel_options", KERNEL_OPTIONS[platform.installer])])
    proxy.sync(token)
