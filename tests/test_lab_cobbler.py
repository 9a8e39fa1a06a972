"""The real cobblerd 3.3.10 of the lab: state dir, PXE output, AutoYaST rendering, power, nopxe.

Runs its own cobblerd in a tmp state dir (not the session lab), so it can check the process
lifecycle too.  Needs root (mount namespace + overlayfs) and `make setup` (.venv-cobbler).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
import urllib.request
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from lab import cobbler_service, procs
from lab.autoyast import parse_autoyast
from lab.procs import ProcessRecord
from tests.helpers import cannot_run

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[1]
COBBLER_VENV = Path(os.environ.get("STORE_ROLLOUT_COBBLER_VENV", REPO / ".venv-cobbler"))
TEMPLATE = REPO / "image_builds" / "autoyast" / "store-hypervisor.xml"

SYSTEM = "store0042-hv01"
MAC = "52:54:00:42:00:01"
META = {
    "salt_master": "10.42.0.5",
    "salt_master_port": "14506",
    "salt_publish_port": "14505",
    "minion_id": "store0042-hv01.stores.example",
    "store_id": "0042",
    "autosign_grain": "store_rollout_token",
    "autosign_token": "tok-0042-a1b2c3",
    "virt_uri": "xen:///system",
    "vm_images_dir": "/srv/store-vm-images",
}


@dataclass
class PowerReceiver:
    """Stands in for the lab's power endpoint: records every fence_lab POST."""

    server: ThreadingHTTPServer
    posts: list[dict[str, Any]] = field(default_factory=list)
    off: set[str] = field(default_factory=set)  # plugs that report "off" on status

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"


def _basic_login(header: str | None) -> str:
    return base64.b64decode((header or "").removeprefix("Basic ")).decode()


def _power_receiver() -> PowerReceiver:
    receiver: PowerReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            receiver.posts.append({**body, "path": self.path,
                                   "login": _basic_login(self.headers.get("Authorization"))})
            state = "off" if body.get("plug") in receiver.off else "on"
            data = json.dumps({"status": state}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    receiver = PowerReceiver(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
    threading.Thread(target=receiver.server.serve_forever, daemon=True).start()
    return receiver


def _overlay_unavailable(scratch: Path) -> str | None:
    """Why the namespace + overlay recipe cannot work here (probed inside scratch), or None."""
    if os.geteuid() != 0:
        return "needs root for unshare -m and overlay mounts"
    for d in "luwm":
        (scratch / d).mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={scratch}/l,upperdir={scratch}/u,workdir={scratch}/w", f"{scratch}/m"],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        return f"unshare -m + overlay mount failed: {probe.stderr.strip()}"
    return None


def _group_alive(record: ProcessRecord) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == record.pid:
                pids.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return pids


@dataclass
class Lab:
    cfg: cobbler_service.CobblerLabConfig
    receiver: PowerReceiver
    records: dict[str, ProcessRecord]
    start_seconds: float

    def login(self) -> tuple[xmlrpc.client.ServerProxy, str]:
        return cobbler_service.login(self.cfg)


@pytest.fixture(scope="module")
def cobbler_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if not (COBBLER_VENV / "bin" / "cobblerd").exists():
        cannot_run(f"no cobbler venv at {COBBLER_VENV}: run `make setup`")
    reason = _overlay_unavailable(tmp_path_factory.mktemp("overlay-probe"))
    if reason:
        cannot_run(reason)
    receiver = _power_receiver()
    cfg = cobbler_service.CobblerLabConfig(
        state_dir=tmp_path_factory.mktemp("lab") / "cobbler",
        venv=COBBLER_VENV,
        xmlrpc_port=procs.free_port(),
        http_port=procs.free_port(),
        user="lab-admin",
        password="lab-Secret-42",
        power_url=f"{receiver.url}/power",
    )
    records: dict[str, ProcessRecord] = {}
    try:
        cobbler_service.prepare_state(cfg)
        started = time.monotonic()
        records = cobbler_service.start(cfg)
        cobbler_service.wait_ready(cfg)
        lab = Lab(cfg, receiver, records, time.monotonic() - started)
        print(f"\ncobblerd + cobbler-http ready in {lab.start_seconds:.2f}s")
        cobbler_service.seed(cfg, TEMPLATE.read_text())
        cobbler_service.seed(cfg, TEMPLATE.read_text())  # idempotent: no duplicate, no fault
        yield lab
    finally:
        cobbler_service.stop(records)
        receiver.server.shutdown()
        receiver.server.server_close()
        for name, record in records.items():
            assert not record.alive(), f"{name} (pid {record.pid}) still running"
            assert not _group_alive(record), f"{name}: group members left: {_group_alive(record)}"


def _create_system(lab: Lab, name: str, mac: str, ip: str, **extra: Any) -> None:
    proxy, token = lab.login()
    handle = proxy.new_system(token)
    fields: list[tuple[str, Any]] = [
        ("name", name),
        ("profile", cobbler_service.PROFILE),
        ("hostname", f"{name}.stores.example"),
        ("modify_interface", {"macaddress-eth0": mac, "ipaddress-eth0": ip,
                              "netmask-eth0": "255.255.255.0", "static-eth0": True,
                              "dnsname-eth0": f"{name}.stores.example"}),
        ("gateway", "192.0.2.1"),
        *extra.items(),
        ("power_type", "lab"),  # only valid because /usr/sbin/fence_lab exists in the namespace
        ("power_id", name),
    ]
    for attribute, value in fields:
        assert proxy.modify_system(handle, attribute, value, token), attribute
    assert proxy.save_system(handle, token)


@pytest.fixture(scope="module")
def system(cobbler_lab: Lab) -> str:
    _create_system(cobbler_lab, SYSTEM, MAC, "192.0.2.42", netboot_enabled=True,
                   autoinstall_meta=META, power_address="bmc-store0042",
                   power_user="bmc-admin", power_pass="bmc-secret")
    proxy, token = cobbler_lab.login()
    assert proxy.sync(token)
    return SYSTEM


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def test_state_stays_in_state_dir(cobbler_lab: Lab) -> None:
    assert not Path("/usr/sbin/fence_lab").exists()
    assert not Path("/etc/cobbler").exists()
    assert (cobbler_lab.cfg.upper("usr-sbin") / "fence_lab").exists()
    assert (cobbler_lab.cfg.upper("var") / "lib/cobbler/collections/distros"
            / f"{cobbler_service.DISTRO}.json").exists()


def test_only_the_lab_user_can_log_in(cobbler_lab: Lab) -> None:
    proxy, token = cobbler_lab.login()
    assert proxy.token_check(token)
    with pytest.raises(xmlrpc.client.Fault, match="login failed"):
        proxy.login("cobbler", "cobbler")


def test_seed_is_idempotent(cobbler_lab: Lab) -> None:
    proxy, _ = cobbler_lab.login()
    assert proxy.get_item_names("distro") == [cobbler_service.DISTRO]
    assert proxy.get_item_names("profile") == [cobbler_service.PROFILE]
    assert proxy.get_profile(cobbler_service.PROFILE)["autoinstall"] == cobbler_service.TEMPLATE


def test_power_types_come_from_the_namespace(cobbler_lab: Lab) -> None:
    proxy, token = cobbler_lab.login()
    handle = proxy.new_system(token)
    assert proxy.modify_system(handle, "power_type", "lab", token)
    with pytest.raises(xmlrpc.client.Fault, match="power management type must be one of: lab"):
        proxy.modify_system(handle, "power_type", "ipmilanplus", token)


def test_autoinstall_renders_salt_minion_config(cobbler_lab: Lab, system: str) -> None:
    proxy, _ = cobbler_lab.login()
    via_xmlrpc = proxy.generate_autoinstall("", system)
    status, via_http = _get(f"{cobbler_lab.cfg.http_url}/cblr/svc/op/autoinstall/system/{system}")
    assert status == 200
    assert via_http == via_xmlrpc
    rendered = parse_autoyast(via_http)

    minion = yaml.safe_load(rendered.files["/etc/salt/minion.d/50-store-rollout.conf"])
    assert minion == {
        "master": META["salt_master"],
        "master_port": int(META["salt_master_port"]),
        "publish_port": int(META["salt_publish_port"]),
        "id": META["minion_id"],
        "grains": {"role": "hypervisor", "store_id": META["store_id"],
                   META["autosign_grain"]: META["autosign_token"],
                   # what hypervisor.checks verifies br0 still has
                   "store_rollout_bridge": {"name": "br0", "bootproto": "static",
                                            "address": "192.0.2.42",
                                            "netmask": "255.255.255.0",
                                            "gateway": "192.0.2.1"}},
        "autosign_grains": [META["autosign_grain"]],
        "startup_states": "highstate",
        "virt": {"connection": {"uri": META["virt_uri"]}, "images": META["vm_images_dir"]},
    }
    # libvirt as Leap 15.6 ships it: the modular Xen daemon, the monolithic libvirtd masked
    assert "<package>python3-libvirt-python</package>" in via_http
    # what step 5 runs on the host: overlay disks and the identity seed ISO
    assert "<package>qemu-tools</package>" in via_http and "<package>xorriso</package>" in via_http
    assert "systemctl enable salt-minion.service virtxend.socket" in via_http
    assert "systemctl mask libvirtd.service" in via_http
    assert "<service>libvirtd</service>" not in via_http
    assert rendered.files["/etc/salt/minion_id"].strip() == META["minion_id"]
    # http_server carries the port, unlike the info= URL Cobbler puts on the kernel line
    assert rendered.nopxe_url == f"{cobbler_lab.cfg.http_url}/cblr/svc/op/nopxe/system/{system}"


def test_profile_render_has_no_nopxe_call(cobbler_lab: Lab) -> None:
    proxy, _ = cobbler_lab.login()
    rendered = parse_autoyast(proxy.generate_autoinstall(cobbler_service.PROFILE, ""))
    assert rendered.nopxe_url is None
    assert yaml.safe_load(rendered.files["/etc/salt/minion.d/50-store-rollout.conf"])["master"] \
        == "salt"


def test_sync_writes_pxe_config(cobbler_lab: Lab, system: str) -> None:
    pxe = (cobbler_lab.cfg.upper("srv") / "tftpboot" / "pxelinux.cfg"
           / ("01-" + MAC.replace(":", "-"))).read_text()
    assert f"kernel /images/{cobbler_service.DISTRO}/linux" in pxe
    assert f"autoyast={cobbler_lab.cfg.http_url}/cblr/svc/op/autoinstall/system/{system}" in pxe


def test_power_reboot_runs_the_fence_agent(cobbler_lab: Lab, system: str) -> None:
    proxy, token = cobbler_lab.login()
    # power_system takes a handle ("system::<name>"), not a bare name
    with pytest.raises(xmlrpc.client.Fault):
        proxy.power_system(system, "status", token)
    cobbler_lab.receiver.posts.clear()
    assert proxy.power_system(f"system::{system}", "reboot", token) is True
    # Cobbler implements reboot itself: agent "off", sleep 5 s, agent "on"
    assert [(p["action"], p["plug"], p["address"], p["path"], p["login"])
            for p in cobbler_lab.receiver.posts] == [
        ("off", system, "bmc-store0042", "/power", "bmc-admin:bmc-secret"),  # the BMC login
        ("on", system, "bmc-store0042", "/power", "bmc-admin:bmc-secret"),
    ]


def test_power_status_and_url_address(cobbler_lab: Lab) -> None:
    name = "store0042-hv02"
    _create_system(cobbler_lab, name, "52:54:00:42:00:02", "192.0.2.43",
                   power_address=f"{cobbler_lab.receiver.url}/bmc/hv02")
    proxy, token = cobbler_lab.login()
    cobbler_lab.receiver.posts.clear()
    assert proxy.power_system(f"system::{name}", "status", token) is True
    cobbler_lab.receiver.off.add(name)
    assert proxy.power_system(f"system::{name}", "status", token) is False
    assert [(p["action"], p["plug"], p["path"]) for p in cobbler_lab.receiver.posts] == [
        ("status", name, "/bmc/hv02"), ("status", name, "/bmc/hv02")]


def test_nopxe_disables_netboot(cobbler_lab: Lab, system: str) -> None:
    proxy, _ = cobbler_lab.login()
    assert proxy.get_system(system)["netboot_enabled"] is True
    nopxe_url = parse_autoyast(proxy.generate_autoinstall("", system)).nopxe_url
    assert nopxe_url
    assert _get(nopxe_url) == (200, "True")
    assert proxy.get_system(system)["netboot_enabled"] is False


def test_sync_system_leaves_other_pxe_configs_alone(cobbler_lab: Lab, system: str) -> None:
    """The rollout's sync: this system's PXE config is rewritten, another system's file is never
    deleted (a full sync would, under a hypervisor PXE-booting at that moment)."""
    from tasks.cobbler import CobblerClient

    pxelinux = cobbler_lab.cfg.upper("srv") / "tftpboot" / "pxelinux.cfg"
    other_mac = "52:54:00:42:00:43"
    _create_system(cobbler_lab, "store-0043-hv", other_mac, "192.0.2.143", netboot_enabled=True,
                   power_address="bmc-store0043")
    ours = pxelinux / ("01-" + MAC.replace(":", "-"))
    other = pxelinux / ("01-" + other_mac.replace(":", "-"))
    def identity(path: Path) -> tuple[int, int]:
        return path.stat().st_ino, path.stat().st_mtime_ns

    ours_before, other_before = identity(ours), identity(other)
    client = CobblerClient(url=cobbler_lab.cfg.xmlrpc_url, user=cobbler_lab.cfg.user,
                           password=cobbler_lab.cfg.password)
    client.sync_system(system)
    assert identity(ours) != ours_before  # written anew
    assert f"LABEL {system}" in ours.read_text()
    assert identity(other) == other_before
    client.sync()  # the full sync, for contrast: every PXE config is deleted and written anew
    assert identity(other) != other_before
    client.remove_system("store-0043-hv")
