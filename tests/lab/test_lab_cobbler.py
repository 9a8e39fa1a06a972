"""The real cobblerd 3.3.10 of the lab: state dir, PXE output, AutoYaST rendering, nopxe.

Runs its own cobblerd in a tmp state dir (not the session lab), so it can check the process
lifecycle too.  Needs root (mount namespace + overlayfs) and `make setup` (.venv-cobbler).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
import xmlrpc.client
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from passlib.hash import sha512_crypt

from lab import cobbler_dhcp, cobbler_service, netboot, procs
from lab.autoyast import parse_autoyast
from lab.procs import ProcessRecord
from lab.store_network import BRIDGE, DHCP_FIRST, DHCP_LAST
from store_rollout.contracts import (
    REGISTRATION_CODE_META,
    REGISTRATION_URL_META,
    ROOT_PASSWORD_HASH_META,
    STORE_PLATFORM_GRAIN,
    STORE_PLATFORM_META,
    UPDATE_REPOS_META,
)
from store_rollout.inventory import parse_inventory
from store_rollout.settings import load_settings
from tests.helpers import BASE_ENV, REPO_ROOT, cannot_run, spec_parts
from tests.unit.tasks.test_root_password import COBBLER_DEFAULT_HASH, glibc_crypt

# the AutoYaST profile's default namespace (yast2ns), as the installer reads it
YAST_NS = "http://www.suse.com/1.0/yast2ns"

pytestmark = pytest.mark.lab

COBBLER_VENV = Path(os.environ.get("STORE_ROLLOUT_COBBLER_VENV", REPO_ROOT / ".venv-cobbler"))
TEMPLATE = REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml"

SYSTEM = "store0042-hv01"
# an update mirror a chain gives in hypervisor_update_repos, besides registration's repositories
UPDATE_MIRROR = ("https://mirror.stores.example/SUSE/Updates/SLE-Product-SLES/15-SP7/x86_64/update/",
                 "https://mirror.stores.example/SUSE/Updates/SLE-Module-Server-Applications/15-SP7/"
                 "x86_64/update/")
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
    # the master's key as step 2 pins it (tasks/salt/master_key.py)
    "master_finger": "3a:9f:" + ":".join(["0c"] * 30),
    "master_hash_type": "sha256",
    STORE_PLATFORM_META: "sles15-xen",
    # a SLES store registering with SCC: the server and the chain's code (step 2's record)
    REGISTRATION_URL_META: "https://scc.suse.com",
    REGISTRATION_CODE_META: "REGCODE-0042-SECRET",
    # as step 2 sends an update mirror given in the settings (update_repos.update_repos_meta;
    # the platform's default is none, registration adds SP7's); no root hash: this record stands
    # for one written without it, whose root the profile locks
    UPDATE_REPOS_META: " ".join(f"update-{n}={url}" for n, url in enumerate(UPDATE_MIRROR, 1)),
}


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
            # a zombie runs nothing: it waits for its parent to reap it (ProcessRecord.alive
            # does not count one either); counted, a stop that ended in time failed a run once
            if os.getpgid(proc.pid) == record.pid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return pids


@dataclass
class Lab:
    cfg: cobbler_service.CobblerLabConfig
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
    cfg = cobbler_service.CobblerLabConfig(
        state_dir=tmp_path_factory.mktemp("lab") / "cobbler",
        venv=COBBLER_VENV,
        xmlrpc_port=procs.free_port(),
        http_port=procs.free_port(),
        user="lab-admin",
        password="lab-Secret-42",
    )
    records: dict[str, ProcessRecord] = {}
    try:
        cobbler_service.prepare_state(cfg)
        cobbler_dhcp.prepare(cfg)
        started = time.monotonic()
        records = cobbler_service.start(cfg)
        cobbler_service.wait_ready(cfg)
        lab = Lab(cfg, records, time.monotonic() - started)
        print(f"\ncobblerd + cobbler-http ready in {lab.start_seconds:.2f}s")
        installer = (netboot.kernel().vmlinuz, netboot.build_initramfs(cfg.state_dir / "boot"))
        cobbler_service.seed(cfg, *installer)
        # idempotent: no duplicate, no fault
        cobbler_service.seed(cfg, *installer)
        yield lab
    finally:
        cobbler_service.stop(records)
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
    ]
    for attribute, value in fields:
        assert proxy.modify_system(handle, attribute, value, token), attribute
    assert proxy.save_system(handle, token)


@pytest.fixture(scope="module")
def system(cobbler_lab: Lab) -> str:
    _create_system(cobbler_lab, SYSTEM, MAC, "192.0.2.42", netboot_enabled=True,
                   autoinstall_meta=META)
    proxy, token = cobbler_lab.login()
    assert proxy.sync(token)
    return SYSTEM


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def test_state_stays_in_state_dir(cobbler_lab: Lab) -> None:
    assert not Path("/etc/cobbler").exists()
    assert (cobbler_lab.cfg.upper("var") / "lib/cobbler/collections/distros"
            / f"{cobbler_service.DISTRO}.json").exists()


def test_only_the_lab_user_can_log_in(cobbler_lab: Lab) -> None:
    proxy, token = cobbler_lab.login()
    assert proxy.token_check(token)
    with pytest.raises(xmlrpc.client.Fault, match="login failed"):
        proxy.login("cobbler", "cobbler")


def test_seed_is_idempotent(cobbler_lab: Lab) -> None:
    proxy, _ = cobbler_lab.login()
    # one distro per installer (AutoYaST's, Agama's)
    assert sorted(proxy.get_item_names("distro")) == sorted(
        name for name, _ in cobbler_service.DISTROS.values())
    # one profile per platform, each serving its platform's template
    assert sorted(proxy.get_item_names("profile")) == sorted(cobbler_service.PROFILES)
    for profile, platform in cobbler_service.PROFILES.items():
        assert proxy.get_profile(profile)["autoinstall"] == Path(platform.template).name
    assert proxy.get_profile(cobbler_service.PROFILE)["autoinstall"] == cobbler_service.TEMPLATE


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
                   STORE_PLATFORM_GRAIN: META[STORE_PLATFORM_META],
                   META["autosign_grain"]: META["autosign_token"],
                   # what hypervisor.checks verifies br0 still has
                   "store_rollout_bridge": {"name": "br0", "bootproto": "static",
                                            "address": "192.0.2.42",
                                            "netmask": "255.255.255.0",
                                            "gateway": "192.0.2.1"}},
        "autosign_grains": [META["autosign_grain"]],
        "master_finger": META["master_finger"], "hash_type": "sha256",
        "startup_states": "highstate",
        "virt": {"connection": {"uri": META["virt_uri"]}, "images": META["vm_images_dir"]},
    }
    # libvirt as SLES 15 SP7 enables it: the modular Xen daemon, the monolithic libvirtd masked
    assert "<package>python3-libvirt-python</package>" in via_http
    # what step 5 runs on the host: overlay disks and the identity seed ISO
    assert "<package>qemu-tools</package>" in via_http and "<package>xorriso</package>" in via_http
    assert "systemctl enable salt-minion.service virtxend.socket virtxend-ro.socket" in via_http
    assert "systemctl mask libvirtd.service" in via_http
    assert "<service>libvirtd</service>" not in via_http
    assert rendered.files["/etc/salt/minion_id"].strip() == META["minion_id"]
    # the libvirt events engine, from the snippet seed() installed (the module file itself)
    engine = cobbler_service.ENGINE_SOURCE
    assert rendered.files[f"/var/cache/salt/minion/extmods/engines/{engine.name}"] \
        == engine.read_text()
    # http_server carries the port, unlike the info= URL Cobbler puts on the kernel line
    assert rendered.nopxe_url == f"{cobbler_lab.cfg.http_url}/cblr/svc/op/nopxe/system/{system}"


def test_profile_render_has_no_nopxe_call(cobbler_lab: Lab) -> None:
    proxy, _ = cobbler_lab.login()
    rendered = parse_autoyast(proxy.generate_autoinstall(cobbler_service.PROFILE, ""))
    assert rendered.nopxe_url is None
    minion = yaml.safe_load(rendered.files["/etc/salt/minion.d/50-store-rollout.conf"])
    assert minion["master"] == "salt"
    # the platform grain's default: the platform this template installs
    assert minion["grains"][STORE_PLATFORM_GRAIN] == "sles15-xen"


def test_sync_writes_pxe_config(cobbler_lab: Lab, system: str) -> None:
    pxe = (cobbler_lab.cfg.upper("srv") / "tftpboot" / "pxelinux.cfg"
           / ("01-" + MAC.replace(":", "-"))).read_text()
    # the lab's installer: Debian's kernel and the initrd lab/netboot.py builds
    kernel = netboot.kernel().vmlinuz.name
    assert f"kernel /images/{cobbler_service.DISTRO}/{kernel}" in pxe
    assert re.search(rf"initrd=/images/{cobbler_service.DISTRO}/installer-\w+\.cpio\.gz ", pxe)
    assert " console=ttyS0" in pxe
    tftp_root = cobbler_lab.cfg.upper("srv") / "tftpboot"
    for loader in ("pxelinux.0", "ldlinux.c32"):  # the BIOS loaders, copied by the sync
        assert (tftp_root / loader).read_bytes()[:4], loader
    assert f"autoyast={cobbler_lab.cfg.http_url}/cblr/svc/op/autoinstall/system/{system}" in pxe


def test_sync_writes_the_dhcp_configuration(cobbler_lab: Lab, system: str) -> None:
    """Cobbler's dnsmasq module writes the store network's DHCP server configuration from the
    lab's template (bridge and range filled in), each system's MAC in it and in /etc/ethers."""
    conf = (cobbler_lab.cfg.upper("etc") / "dnsmasq.conf").read_text()
    assert f"interface={BRIDGE}\n" in conf and "@" not in conf
    assert f"dhcp-range={DHCP_FIRST},{DHCP_LAST},255.255.0.0,1h\n" in conf
    assert "enable-tftp\ntftp-root=/srv/tftpboot\n" in conf
    assert f"dhcp-host=net:x86_64,{MAC},{system}.stores.example,192.0.2.42\n" in conf
    ethers = (cobbler_lab.cfg.upper("etc") / "ethers").read_text()
    assert f"{MAC.upper()}\t192.0.2.42\n" in ethers


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


# -- what a store host gets besides its minion: root password, reports, update repos, nopxe ----

def _yast(elem: ET.Element, path: str) -> list[ET.Element]:
    return elem.findall(path.replace("{y}", f"{{{YAST_NS}}}"))


def _root_password(rendered: str) -> str:
    """The root `<user_password>` of a rendered profile."""
    doc = ET.fromstring(rendered.lstrip())
    passwords = [(u.findtext(f"{{{YAST_NS}}}user_password") or "")
                 for u in _yast(doc, ".//{y}users/{y}user")
                 if u.findtext(f"{{{YAST_NS}}}username") == "root"]
    assert len(passwords) == 1, passwords
    return passwords[0]


def _client(lab: Lab) -> Any:
    from tasks.cobbler import CobblerClient

    return CobblerClient(url=lab.cfg.xmlrpc_url, user=lab.cfg.user, password=lab.cfg.password)


def test_profile_reports_instead_of_waiting_and_adds_the_update_repos(
        cobbler_lab: Lab, system: str) -> None:
    proxy, _ = cobbler_lab.login()
    rendered = proxy.generate_autoinstall("", system)
    doc = ET.fromstring(rendered.lstrip())
    # every popup kind closes itself after 10 s and is logged (YaST's default waits for a key)
    for kind in ("errors", "warnings", "messages"):
        (section,) = _yast(doc, f"{{y}}report/{{y}}{kind}")
        assert {c.tag.rsplit("}", 1)[-1]: c.text for c in section} == {
            "show": "true", "timeout": "10", "log": "true"}, kind
    entries = [(e.findtext(f"{{{YAST_NS}}}alias"), e.findtext(f"{{{YAST_NS}}}media_url"),
                e.findtext(f"{{{YAST_NS}}}ask_on_error"))
               for e in _yast(doc, "{y}add-on/{y}add_on_others/{y}listentry")]
    assert entries == [(f"update-{n}", url, "false") for n, url in enumerate(UPDATE_MIRROR, 1)]
    # a record without a root hash: root locked, never Cobbler's default_password_crypted
    assert _root_password(rendered) == "!"
    assert proxy.get_settings()["default_password_crypted"] == COBBLER_DEFAULT_HASH
    assert COBBLER_DEFAULT_HASH not in rendered
    # the profile alone (no system, no update_repos, no registration): no add-on section, no
    # registration, root locked
    alone = proxy.generate_autoinstall(cobbler_service.PROFILE, "")
    assert "<add-on>" not in alone and _root_password(alone) == "!"
    assert _registration(alone) is None


def _registration(rendered: str) -> dict[str, Any] | None:
    """A rendered profile's <suse_register> as {field: text, "addons": [(name, version)]}, or
    None without one."""
    sections = _yast(ET.fromstring(rendered.lstrip()), "{y}suse_register")
    if not sections:
        return None
    (section,) = sections
    found: dict[str, Any] = {c.tag.rsplit("}", 1)[-1]: c.text for c in section
                             if c.tag.rsplit("}", 1)[-1] != "addons"}
    found["addons"] = [(a.findtext(f"{{{YAST_NS}}}name"), a.findtext(f"{{{YAST_NS}}}version"))
                       for a in _yast(section, "{y}addons/{y}addon")]
    return found


# what a SLES 15 SP7 Xen host registers besides the product: Salt from Basesystem, Xen and
# libvirt-daemon-xen from Server Applications
SP7_MODULES = [("sle-module-basesystem", "15.7"), ("sle-module-server-applications", "15.7")]


def test_a_sles_store_registers_with_its_server_and_code(cobbler_lab: Lab, system: str) -> None:
    """The render of a SLES store's record registers the host with the record's server and
    code, the modules a Xen host installs from, and installs the updates; the product is SLES."""
    proxy, _ = cobbler_lab.login()
    rendered = proxy.generate_autoinstall("", system)
    assert _registration(rendered) == {
        "do_registration": "true", "reg_server": META[REGISTRATION_URL_META],
        "reg_code": META[REGISTRATION_CODE_META], "install_updates": "true",
        "addons": SP7_MODULES}
    doc = ET.fromstring(rendered.lstrip())
    assert [p.text for p in _yast(doc, "{y}software/{y}products/{y}product")] == ["SLES"]


def test_an_rmt_store_registers_without_a_code(cobbler_lab: Lab) -> None:
    """A record with a registration server and no code (RMT registers without one): the render
    registers with the server and has no reg_code, nor any trace of another record's code."""
    name = "store0042-hv05"
    meta = {k: v for k, v in META.items() if k != REGISTRATION_CODE_META}
    meta[REGISTRATION_URL_META] = "https://rmt.stores.example"
    _create_system(cobbler_lab, name, "52:54:00:42:00:05", "192.0.2.45", autoinstall_meta=meta)
    proxy, token = cobbler_lab.login()
    try:
        rendered = proxy.generate_autoinstall("", name)
        registration = _registration(rendered)
        assert registration is not None
        assert registration["reg_server"] == "https://rmt.stores.example"
        assert "reg_code" not in registration and "<reg_code>" not in rendered
        assert META[REGISTRATION_CODE_META] not in rendered
        assert registration["addons"] == SP7_MODULES
    finally:
        proxy.remove_system(name, token)


def test_step_4_forgets_the_registration_code(cobbler_lab: Lab) -> None:
    """Step 2's record of a SLES store on SCC holds the chain's registration code, and the
    render registers with it; installed and ready (step 4), the record keeps neither the code nor
    the token, what Cobbler serves has no code, and the host still registers (the server
    stays); a rerun finds it clean."""
    from tasks.cobbler import forget_install_secrets, system_spec

    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_REGISTRATION_URL": "https://scc.suse.com",
                              "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK": "regcode"})
    client = _client(cobbler_lab)
    run = uuid.uuid4().hex[:6]
    (store,) = parse_inventory({"stores": [{
        "store_id": f"g{run}",
        "hypervisor": {"hostname": f"hv-g{run}.stores.example", "mac": "52:54:00:77:00:09",
                       "ip": "192.0.2.79", "netmask": "255.255.255.0", "gateway": "192.0.2.1"},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "T-9"}}]}).stores
    code = f"REGCODE-{run}"
    try:
        spec = system_spec(store, *spec_parts(settings), f"tok-{run}", registration_code=code)
        assert client.upsert_system(spec) is True
        assert client.get_system(store.cobbler_system)["autoinstall_meta"][
            REGISTRATION_CODE_META] == code
        registration = _registration(client.render_autoinstall(store.cobbler_system))
        assert registration is not None
        assert (registration["reg_server"], registration["reg_code"]) \
            == ("https://scc.suse.com", code)
        assert forget_install_secrets(store, client) == ["autosign_token",
                                                         REGISTRATION_CODE_META]
        meta = client.get_system(store.cobbler_system)["autoinstall_meta"]
        assert not {"autosign_token", REGISTRATION_CODE_META} & set(meta), meta
        assert meta[REGISTRATION_URL_META] == "https://scc.suse.com"
        rendered = client.render_autoinstall(store.cobbler_system)
        assert code not in rendered and f"tok-{run}" not in rendered
        registration = _registration(rendered)
        assert registration is not None and "reg_code" not in registration
        assert registration["reg_server"] == "https://scc.suse.com"
        assert forget_install_secrets(store, client) == []
    finally:
        client.remove_system(store.cobbler_system)


def test_two_stores_get_root_passwords_of_their_own(cobbler_lab: Lab,
                                                    prefect_harness: None) -> None:
    """Step 2's records of two stores, rendered by Cobbler: each root hash is of the password in
    its store's Secret block, the two differ, neither is Cobbler's default; a rerun of step 2
    keeps the password and the hash."""
    from tasks.cobbler import forget_install_secrets, system_spec
    from tasks.root_password import store_root_password, store_root_password_hash

    settings = load_settings(BASE_ENV)
    client = _client(cobbler_lab)
    run = uuid.uuid4().hex[:6]
    stores = parse_inventory({"stores": [{
        "store_id": f"r{run}-{n}",
        "hypervisor": {"hostname": f"hv-{run}-{n}.stores.example", "mac": f"52:54:00:77:00:0{n}",
                       "ip": f"192.0.2.7{n}", "netmask": "255.255.255.0", "gateway": "192.0.2.1"},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": f"T-{n}"}} for n in (1, 2)]}).stores
    hashes: dict[str, str] = {}
    try:
        for store in stores:
            spec = system_spec(store, *spec_parts(settings), f"tok-{store.store_id}",
                               store_root_password_hash(
                                   store, client.get_system(store.cobbler_system)))
            assert client.upsert_system(spec) is True
            rendered = client.render_autoinstall(store.cobbler_system)
            hashed = _root_password(rendered)
            password = store_root_password(store.store_id).get_secret_value()
            assert hashed.startswith("$6$") and password not in rendered
            assert sha512_crypt.verify(password, hashed)
            assert glibc_crypt(password, hashed) in (None, hashed)
            assert COBBLER_DEFAULT_HASH not in rendered
            hashes[store.store_id] = hashed
        assert len(set(hashes.values())) == 2
        # a rerun of step 2: the same Secret, and the hash Cobbler holds kept as it is
        first = stores[0]
        assert client.get_system(first.cobbler_system)["autoinstall_meta"][
            ROOT_PASSWORD_HASH_META] == hashes[first.store_id]
        again = system_spec(first, *spec_parts(settings), "tok-rerun", store_root_password_hash(
            first, client.get_system(first.cobbler_system)))
        assert client.upsert_system(again) is False
        assert _root_password(client.render_autoinstall(first.cobbler_system)) \
            == hashes[first.store_id]
        # installed and ready (step 4): neither the token nor the hash stays in the record
        # or in what Cobbler serves for it; the rest stays; a rerun finds it clean
        assert forget_install_secrets(first, client) == ["autosign_token",
                                                         ROOT_PASSWORD_HASH_META]
        meta = client.get_system(first.cobbler_system)["autoinstall_meta"]
        assert not {"autosign_token", ROOT_PASSWORD_HASH_META} & set(meta), meta
        assert meta["minion_id"] == first.hypervisor_minion_id
        rendered = client.render_autoinstall(first.cobbler_system)
        assert "tok-rerun" not in rendered and hashes[first.store_id] not in rendered
        assert _root_password(rendered) == "!"
        assert forget_install_secrets(first, client) == []
    finally:
        for store in stores:
            client.remove_system(store.cobbler_system)


def _nopxe_script(rendered: str) -> str:
    doc = ET.fromstring(rendered.lstrip())
    (script,) = [s for s in _yast(doc, "{y}scripts/{y}chroot-scripts/{y}script")
                 if s.findtext(f"{{{YAST_NS}}}filename") == "99-cobbler-nopxe.sh"]
    return script.findtext(f"{{{YAST_NS}}}source") or ""


def test_nopxe_script_fails_unless_cobbler_says_true(cobbler_lab: Lab) -> None:
    """The install's last script: Cobbler's 200 "True" passes; its 200 "False" (no such system,
    or pxe_just_once off) and no answer at all fail it, naming what Cobbler said (YaST reports
    a failed script and logs its output)."""
    name = "store0042-hv04"
    _create_system(cobbler_lab, name, "52:54:00:42:00:04", "192.0.2.44", netboot_enabled=True)
    proxy, token = cobbler_lab.login()
    try:
        script = _nopxe_script(proxy.generate_autoinstall("", name))

        def run(text: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                                  timeout=120)

        done = run(script)
        assert (done.returncode, done.stdout.strip()) == (0, f"Cobbler turned netboot off for {name}")
        assert proxy.get_system(name)["netboot_enabled"] is False
        refused = run(script.replace(f"/nopxe/system/{name}", "/nopxe/system/no-such-system"))
        assert refused.returncode == 1
        assert "answered 'False', not 'True'" in refused.stderr
        assert f"netboot is still on for {name}" in refused.stderr
        closed = procs.free_port()
        silent = run(script.replace(f"{cobbler_lab.cfg.http_url}/", f"http://127.0.0.1:{closed}/"))
        assert silent.returncode == 1 and "answered 'no answer (curl exit 7)'" in silent.stderr
    finally:
        proxy.remove_system(name, token)


def test_preflight_refuses_a_profile_that_falls_back_to_a_shared_root_password(
        cobbler_lab: Lab) -> None:
    from tasks.preflight import root_password_problem

    client = _client(cobbler_lab)
    # each platform's own profile, AutoYaST XML and Agama JSON: root locked without a hash
    for profile in cobbler_service.PROFILES:
        assert root_password_problem(client, profile) is None, profile
    ours = "<user_password>$root_password_hash</user_password>"
    template = TEMPLATE.read_text()
    assert ours in template
    variants = {
        # the profile before issue 27: Cobbler's default_password_crypted without a hash
        "old-fallback": ("<user_password>$getVar('root_password_hash', "
                         "$getVar('default_password_crypted', ''))</user_password>",
                         "falls back to Cobbler's default_password_crypted"),
        "fixed-hash": (r"<user_password>\$6\$salt\$one-for-all</user_password>",
                       "gives root a password of its own"),
        "no-password": ("<user_password></user_password>", "leaves root's password empty"),
    }
    proxy, token = cobbler_lab.login()
    try:
        for name, (line, problem) in variants.items():
            proxy.write_autoinstall_template(f"{name}.xml", template.replace(ours, line), token)
            handle = proxy.new_profile(token)
            for key, value in (("name", name), ("distro", cobbler_service.DISTRO),
                               ("autoinstall", f"{name}.xml")):
                assert proxy.modify_profile(handle, key, value, token), key
            assert proxy.save_profile(handle, token)
            found = root_password_problem(client, name)
            assert found is not None and problem in found, (name, found)
            assert f"Cobbler profile {name!r}" in found
            assert "image_builds/autoyast/sles15-xen.xml" in found
    finally:
        for name in variants:
            proxy.remove_profile(name, token)
            proxy.remove_autoinstall_template(f"{name}.xml", token)
    assert sorted(proxy.get_item_names("profile")) == sorted(cobbler_service.PROFILES)
