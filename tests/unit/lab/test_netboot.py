"""The full lab's network installer (lab/netboot.py, lab/installer/) under QEMU, without a lab:
the boot sector under SeaBIOS, and the installer booted from Debian's kernel with its initrd,
installing from a profile served on this machine's loopback.

The guest's network is QEMU's user-mode network with `restrict=on` (no way out of QEMU), its one
way out being a guestfwd to this test's HTTP server on 127.0.0.1 (through `busybox nc`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lab import netboot
from lab.autoyast import parse_autoyast
from tests.helpers import cannot_run, wait_for

QEMU = "qemu-system-x86_64"
# where the guest reaches the test's server (guestfwd), on QEMU's user-mode network
SERVER_IN_GUEST = "10.0.2.100:8080"

# Cobbler's nopxe as the profiles' script that runs outside the installed system
NOPXE = """url="http://SERVER/cblr/svc/op/nopxe/system/store-nb-hv"
answer=$(curl -fsS --retry 5 --max-time 60 "$url") || answer="no answer (curl exit $?)"
if [ "$answer" != "True" ]; then
  echo "Cobbler nopxe $url answered '$answer', not 'True'" >&2
  exit 1
fi
echo "Cobbler turned netboot off for store-nb-hv"
""".replace("SERVER", SERVER_IN_GUEST)

PROFILE = """<?xml version="1.0"?>
<!DOCTYPE profile>
<profile xmlns="http://www.suse.com/1.0/yast2ns" xmlns:config="http://www.suse.com/1.0/configns">
  <files config:type="list">
    <file>
      <file_path>/etc/salt/minion.d/50-store-rollout.conf</file_path>
      <file_owner>root.root</file_owner>
      <file_permissions>600</file_permissions>
      <file_contents><![CDATA[master: '10.77.0.1'
id: 'store-nb-hv'
grains:
  store_id: 'nb'
  store_rollout_token: 'tok-123'
]]></file_contents>
    </file>
    <file>
      <file_path>/var/cache/salt/minion/extmods/engines/</file_path>
    </file>
    <file>
      <file_path>/var/cache/salt/minion/extmods/engines/store_libvirt_events.py</file_path>
      <file_permissions>644</file_permissions>
      <file_contents><![CDATA[def start(uri=None):
    # a <tag> & an ampersand stay as they are in CDATA
    return uri
]]></file_contents>
    </file>
    <file>
      <file_path>/etc/salt/minion_id</file_path>
      <file_contents><![CDATA[store-nb-hv
]]></file_contents>
    </file>
  </files>
  <scripts>
    <chroot-scripts config:type="list">
      <script>
        <filename>10-enable-salt-minion.sh</filename>
        <chrooted config:type="boolean">true</chrooted>
        <source><![CDATA[
echo "chrooted: not the installer's to run" > /tmp/must-not-exist
]]></source>
      </script>
      <script>
        <filename>99-cobbler-nopxe.sh</filename>
        <chrooted config:type="boolean">false</chrooted>
        <interpreter>shell</interpreter>
        <source><![CDATA[
NOPXE]]></source>
      </script>
    </chroot-scripts>
  </scripts>
</profile>
""".replace("SERVER", SERVER_IN_GUEST).replace("NOPXE", NOPXE)
PROFILE_PATH = "/cblr/svc/op/autoinstall/system/store-nb-hv"

# the same install as Agama's profile (sle16-kvm), which the installer finds at inst.auto=
AGAMA_PROFILE = json.dumps({
    "product": {"id": "SLES"},
    "files": [
        {"destination": "/etc/salt/minion.d/50-store-rollout.conf", "permissions": "0600",
         "content": "master: '10.77.0.1'\nid: 'store-nb-hv'\ngrains:\n  store_id: 'nb'\n"
                    "  store_rollout_token: 'tok-123'\n"},
        {"destination": "/var/cache/salt/minion/extmods/engines/store_libvirt_events.py",
         "content": 'def start(uri=None):\n    return {"uri": uri, "quote": "\\""}\n'},
        {"destination": "/etc/salt/minion_id", "content": "store-nb-hv\n"},
    ],
    "scripts": {"post": [
        {"name": "10-enable-salt-minion.sh",
         "content": "#!/bin/sh\necho chrooted > /tmp/must-not-exist\n"},
        {"name": "99-cobbler-nopxe.sh", "chroot": False,
         "content": f"#!/bin/sh\n{NOPXE}"},
    ]},
}, indent=2)
AGAMA_PATH = "/agama/store-nb-hv.json"


@pytest.fixture(scope="module")
def kernel() -> netboot.Kernel:
    if shutil.which(QEMU) is None:
        cannot_run(f"{QEMU} is missing: run `make setup`")
    try:
        return netboot.kernel()
    except FileNotFoundError as exc:
        cannot_run(str(exc))


class ProfileServer(ThreadingHTTPServer):
    nopxe_answer = "True"
    requests: list[tuple[str, str]]


class Handler(BaseHTTPRequestHandler):
    server: ProfileServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests.append((self.path, self.headers.get("User-Agent", "")))
        if self.path == PROFILE_PATH:
            body = PROFILE
        elif self.path == AGAMA_PATH:
            body = AGAMA_PROFILE
        elif self.path == "/cblr/svc/op/nopxe/system/store-nb-hv":
            body = self.server.nopxe_answer
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ProfileServer]:
    srv = ProfileServer(("127.0.0.1", 0), Handler)
    srv.requests = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


# what the kernel command line names: AutoYaST's profile; or, as Cobbler's suse breed adds
# autoyast= to every profile's options, both, Agama's option being the one its installer reads
INSTALLERS = {"autoyast": f"autoyast=http://{SERVER_IN_GUEST}{PROFILE_PATH}",
              "agama": f"autoyast=http://{SERVER_IN_GUEST}{PROFILE_PATH} "
                       f"inst.auto=http://{SERVER_IN_GUEST}{AGAMA_PATH}"}


def boot_installer(kernel: netboot.Kernel, tmp_path: Path, port: int,
                   installer: str = "autoyast") -> tuple[subprocess.Popen[bytes], Path, Path]:
    initrd = netboot.build_initramfs(tmp_path / "boot")
    disk = tmp_path / "disk.raw"
    with disk.open("wb") as fh:
        fh.truncate(netboot.DISK_MIB * 1024 * 1024)
    console = tmp_path / "console.log"
    qemu = subprocess.Popen(
        [QEMU, "-machine", "pc", "-m", "256", "-display", "none", "-nodefaults",
         "-no-user-config", "-no-reboot", "-serial", f"file:{console}",
         "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
         "-append", f"console=ttyS0 {INSTALLERS[installer]}",
         "-drive", f"file={disk},format=raw,if=virtio",
         # a command per connection (a tcp: target would be one connection for QEMU's life)
         "-netdev", f"user,id=n0,restrict=on,"
                    f"guestfwd=tcp:{SERVER_IN_GUEST}-cmd:{netboot.BUSYBOX} nc 127.0.0.1 {port}",
         "-device", "virtio-net-pci,netdev=n0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return qemu, disk, console


def read(console: Path) -> str:
    """The console so far (QEMU makes the file as it starts)."""
    return console.read_text(errors="replace") if console.exists() else ""


@pytest.mark.parametrize("installer", sorted(INSTALLERS))
def test_the_installer_lays_down_the_profile_calls_nopxe_and_reboots(
        kernel: netboot.Kernel, server: ProfileServer, tmp_path: Path, installer: str) -> None:
    qemu, disk, console = boot_installer(kernel, tmp_path, server.server_address[1], installer)
    try:
        # -no-reboot: QEMU exits when the installer reboots
        assert qemu.wait(timeout=120) == 0, qemu.stderr.read() if qemu.stderr else ""
    finally:
        if qemu.poll() is None:
            qemu.kill()
    text = console.read_text(errors="replace")
    assert f"{netboot.INSTALLER_DONE_MARKER} " in text, text[-3000:]
    assert netboot.INSTALLER_FAILED_MARKER not in text
    # the profile first, then nopxe, both by the installer's own HTTP client
    profile_path = AGAMA_PATH if installer == "agama" else PROFILE_PATH
    assert [path for path, _ in server.requests] == [
        profile_path, "/cblr/svc/op/nopxe/system/store-nb-hv"]
    assert all(agent == "Wget" for _, agent in server.requests), server.requests

    installed = netboot.read_install(disk)
    assert installed is not None
    if installer == "agama":
        expected = {f["destination"].lstrip("/"): f["content"]
                    for f in json.loads(AGAMA_PROFILE)["files"]}
    else:
        expected = {path.lstrip("/"): text for path, text in parse_autoyast(PROFILE).files.items()
                    if not path.endswith("/")}
    assert {k: v for k, v in installed.items() if k != netboot.INSTALL_ID_FILE} == expected
    assert len(installed[netboot.INSTALL_ID_FILE].strip()) == 36  # a UUID per install
    assert disk.read_bytes()[:512] == netboot.BOOT_SECTOR
    with disk.open("rb") as fh:
        fh.seek(netboot.INSTALL_OFFSET)
        with tarfile.open(fileobj=fh, mode="r|") as tar:
            modes = {m.name.removeprefix("./"): m.mode & 0o777 for m in tar}
    assert modes["etc/salt/minion.d/50-store-rollout.conf"] == 0o600
    assert modes["var/cache/salt/minion/extmods/engines"] == 0o755
    assert "tmp/must-not-exist" not in modes


def test_an_install_whose_nopxe_fails_stops_without_a_reboot(
        kernel: netboot.Kernel, server: ProfileServer, tmp_path: Path) -> None:
    """Cobbler answering "False" (netboot stays on): the installer says so and stays at its
    error, as a stopped installer does; it never reboots into a reinstall loop."""
    server.nopxe_answer = "False"
    qemu, _, console = boot_installer(kernel, tmp_path, server.server_address[1])
    try:
        wait_for(lambda: netboot.INSTALLER_FAILED_MARKER in read(console),
                 timeout=120, what="the installer's failure on its console")
        text = console.read_text(errors="replace")
        assert "script 01-99-cobbler-nopxe.sh failed" in text
        assert "answered 'False', not 'True'" in text
        assert qemu.poll() is None  # no reboot
    finally:
        qemu.kill()
        qemu.wait(10)


def test_the_disk_boots_its_boot_sector_under_seabios(tmp_path: Path) -> None:
    """The installed disk under the BIOS QEMU boots (SeaBIOS): the boot sector's line on the
    serial console, then a halt (QEMU stays up, idle)."""
    if shutil.which(QEMU) is None:
        cannot_run(f"{QEMU} is missing: run `make setup`")
    disk = tmp_path / "disk.raw"
    disk.write_bytes(netboot.BOOT_SECTOR + b"\0" * (1024 * 1024))
    console = tmp_path / "console.log"
    qemu = subprocess.Popen([QEMU, "-machine", "pc", "-m", "16", "-display", "none",
                             "-nodefaults", "-no-user-config", "-serial", f"file:{console}",
                             "-drive", f"file={disk},format=raw,if=virtio"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: netboot.DISK_BOOT_MARKER in read(console), timeout=30,
                 what="the boot sector's line")
        assert qemu.poll() is None
    finally:
        qemu.kill()
        qemu.wait(10)


def test_modules_load_dependencies_first(kernel: netboot.Kernel, tmp_path: Path) -> None:
    order = [p.name.removesuffix(".ko") for p in netboot.module_order(kernel.modules_dir)]
    for before, after in [("virtio_ring", "virtio"), ("virtio", "virtio_pci"),
                          ("failover", "net_failover"), ("net_failover", "virtio_net"),
                          ("virtio", "virtio_blk")]:
        assert order.index(before) < order.index(after), order
    assert len(order) == len(set(order))
    (tmp_path / "a.ko").write_bytes(b"\0depends=b\0")
    (tmp_path / "b.ko").write_bytes(b"\0depends=a\0")
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        netboot.module_order(tmp_path, ("a",))
    (tmp_path / "c.ko").write_bytes(b"\0depends=missing_one\0")
    with pytest.raises(FileNotFoundError, match="missing_one \\(needed by c\\).*make setup"):
        netboot.module_order(tmp_path, ("c",))


def test_a_disk_without_an_install_reads_as_none(tmp_path: Path) -> None:
    blank = tmp_path / "blank.raw"
    blank.write_bytes(b"\0" * 4096)
    assert netboot.read_install(blank) is None
    assert netboot.read_install(tmp_path / "absent.raw") is None


def test_the_store_host_domains_are_valid_libvirt_xml(tmp_path: Path) -> None:
    """Both lab machines (the default lab's, that cannot boot, and the full lab's, that boots
    from the network) as libvirt's own schema reads them."""
    from lab.hardware import host_xml, netbooting_host_xml

    if shutil.which("virt-xml-validate") is None:
        cannot_run("virt-xml-validate is missing: run `make setup`")
    files = netboot.HostFiles(tmp_path / "disk.raw", tmp_path / "console.log")
    for name, text in (("default", host_xml("h", "s1", "52:54:00:00:00:01")),
                       ("full", netbooting_host_xml("h", "s1", "52:54:00:00:00:01", files, "qemu"))):
        path = tmp_path / f"{name}.xml"
        path.write_text(text)
        checked = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True,
                                 text=True, timeout=60)
        assert checked.returncode == 0, (name, checked.stderr)
    assert "<qemu:arg value='strict=off'/>" in path.read_text()  # the full lab's firmware
