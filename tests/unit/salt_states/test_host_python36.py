"""What runs on a store host runs under the store host's interpreter: openSUSE Leap 15.6's
salt-minion is SUSE's Salt 3006.0 on Python 3.6.15. Every function of salt_states/_modules and
_states that the pipeline or the states call is called here through Salt 3006.0's own loader,
with the salt_states/_utils modules they reach through __utils__, in a Python 3.6 venv
(`make setup` builds .venv-host-py36 from requirements-host-py36.lock), with real qemu-img,
xorriso, HTTP and libvirt (its in-process test driver); so is the hypervisor's libvirt events
engine (salt_states/_engines/store_libvirt_events.py), started by Salt's engine loader
(tests/host36/run_engine.py).

The lab's hypervisor minions run 3006.30 on the project's Python instead: 3006.0 speaks Salt's
auth protocol 2, which the 3008 master refuses by default, and 3006.30 does not run on 3.6 (its
systemd_service module is 3.8 syntax; its dependencies need 3.9). docs/production.md has the
matrix.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.state import REPO_ROOT, SALT_STATES_DIR
from store_rollout.contracts import (
    DATA_DISK_LABEL,
    DATA_DISK_MOUNT,
    HYPERVISOR_EXTENSION_FORMS,
    LIBVIRT_CONNECTION_LOST,
    LIBVIRT_CONNECTION_RESTORED,
    LIBVIRT_EVENT_TAG_PREFIX,
    STORE_EVENT_SIGNATURE,
)
from tests.helpers import load_salt_module

HOST_PY36 = Path(os.environ.get("STORE_ROLLOUT_HOST_PY36_VENV",
                                REPO_ROOT / ".venv-host-py36")) / "bin" / "python"
RUNNER = REPO_ROOT / "tests" / "host36" / "run_host_calls.py"
URI = "test:///default"  # libvirt's in-process driver: one shared state per process
VM = "store-0036-vm"
HV = "store-0036-hv"


def run_on_host_python(tmp: Path, calls: list[dict[str, Any]], define: tuple[str, ...] = (),
                       extra_opts: dict[str, Any] | None = None, argv_prefix: tuple[str, ...] = (),
                       **harness: list[str]) -> list[dict[str, Any]]:
    """Each call's result, made by Salt 3006.0's loader under Python 3.6; `harness`: the
    runner's `start` and `stop_during_listing` (tests/host36/run_host_calls.py); `extra_opts`
    over the minion config below; `argv_prefix`: what the runner runs under (a namespace)."""
    if not HOST_PY36.exists():
        pytest.fail(f"{HOST_PY36} missing: `make setup` builds it (needs CPython 3.6, README)")
    root = tmp / "minion-root"
    opts = {
        "id": HV, "root_dir": str(root), "conf_file": str(root / "etc/salt/minion"),
        "cachedir": str(root / "var/cache/salt/minion"), "pki_dir": str(root / "etc/salt/pki"),
        "sock_dir": str(root / "var/run/salt"), "log_file": str(root / "minion.log"),
        "module_dirs": [str(SALT_STATES_DIR / "_modules")],
        "states_dirs": [str(SALT_STATES_DIR / "_states")],
        # what a sync puts in the minion's extmods/utils: storevirt's __utils__
        "utils_dirs": [str(SALT_STATES_DIR / "_utils")],
        "virt": {"connection": {"uri": URI}, "images": str(tmp / "images")},
        "extension_modules": str(tmp / "extmods"),
        "test": False,
        **(extra_opts or {}),
    }
    proc = subprocess.run([*argv_prefix, str(HOST_PY36), str(RUNNER)], input=json.dumps(
        {"opts": opts, "calls": calls, "define": list(define), **harness}),
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["python"][:2] == [3, 6] and out["salt"] == "3006.0", out
    return out["results"]


def ok(result: dict[str, Any]) -> Any:
    assert result["ok"], result["error"]
    return result["ret"]


@pytest.fixture
def image_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain static HTTP server on loopback (HTTP/1.1 with byte ranges is not needed here:
    a whole download is what the first call of a host does)."""
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def synced_extensions(extmods: Path) -> dict[str, str]:
    """Lay out `extmods` as saltutil.sync_utils/sync_modules leave it from salt_states (a
    compiled file beside them, which a sync never copies), and return what the master's file
    server says of the same files (tasks/salt/extensions.py, this process's Salt)."""
    for form in HYPERVISOR_EXTENSION_FORMS:
        shutil.copytree(SALT_STATES_DIR / f"_{form}", extmods / form,
                        ignore=shutil.ignore_patterns("__pycache__"))
        (extmods / form / "__pycache__").mkdir()
        (extmods / form / "__pycache__" / "x.cpython-36.pyc").write_bytes(b"\0")
    # in a process of its own: Salt's loggers need Salt's logger class, which another test of
    # this worker may have replaced before salt.fileserver was first imported ('Logger' object
    # has no attribute 'trace', seen under xdist)
    served = subprocess.run(
        [sys.executable, "-c", MASTER_HASHES, str(SALT_STATES_DIR),
         str(extmods.parent / "master-cache")],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    hashes: dict[str, str] = json.loads(served.stdout)
    return hashes


MASTER_HASHES = """
import json, sys
import salt.config, salt.fileserver
from tasks.salt.extensions import served_extension_hashes
opts = salt.config.master_config(None)
opts.update({"file_roots": {"base": [sys.argv[1]]}, "fileserver_backend": ["roots"],
             "cachedir": sys.argv[2]})
print(json.dumps(served_extension_hashes(salt.fileserver.Fileserver(opts), "sha256")))
"""


def domain_xml(disk: Path, seed: Path) -> str:
    # the seed CD-ROM already names its ISO: the test driver cannot update devices
    return f"""<domain type='test'><name>{VM}</name><memory>65536</memory>
<os><type>hvm</type></os><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>
<target dev='vda' bus='virtio'/></disk>
<disk type='file' device='cdrom'><source file='{seed}'/><target dev='sda' bus='sata'/>
<readonly/></disk></devices></domain>"""


def test_storevirt_runs_under_the_store_hosts_python(tmp_path: Path,
                                                     image_server: tuple[str, Path]) -> None:
    url, served = image_server
    image = served / "image.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True)
    sha256 = hashlib.sha256(image.read_bytes()).hexdigest()
    key = "k" + sha256[:12]
    images = tmp_path / "images"
    base = images / "base" / key / "image.qcow2"
    disk = images / VM / "system.qcow2"
    seed = images / VM / "seed.iso"
    identity = {"minion_id": VM, "store_id": "0036", "autosign_token": "a" * 48}
    calls = [
        {"fun": "storevirt.ensure_base_image",
         "args": [f"{url}/image.qcow2", key, sha256], "kwargs": {"meta": {"key": key}}},
        {"fun": "storevirt.ensure_base_image", "args": [f"{url}/image.qcow2", key, sha256]},
        {"fun": "storevirt.create_overlay", "args": [VM, str(base), 64]},
        {"fun": "storevirt.create_overlay", "args": [VM, str(base), 64]},
        {"fun": "storevirt.seed_path", "args": [VM]},
        {"fun": "storevirt.seed_identity", "args": [VM, identity]},
        {"fun": "file.get_mode", "args": [str(seed)]},
        {"fun": "storevirt.domain_summary", "args": [VM]},
        {"fun": "storevirt.domain_summary", "args": ["store-0037-vm"]},
        {"fun": "storevirt.inspect", "args": [{HV: {"domains": [VM], "base_images": [key, "nokey"]}}]},
        {"fun": "storevirt.inspect", "args": [], "kwargs": {"base_images": [key]}},
        {"fun": "storevirt.retire_seed", "args": [VM]},
        {"fun": "storevirt.remove_vm", "args": [VM]},
        {"fun": "storevirt.extension_hashes", "args": [list(HYPERVISOR_EXTENSION_FORMS), "sha256"]},
    ]
    served = synced_extensions(tmp_path / "extmods")
    (first, again, overlay, overlay_again, seed_at, seeded, seed_mode, summary, missing, inspected,
     every, retired, removed, hashes) = run_on_host_python(
        tmp_path, calls, define=[domain_xml(disk, seed)])
    # the host's view of its synced extensions is the master's (Salt 3008's file server)
    assert ok(hashes) == served and "modules/storevirt.py" in served
    assert ok(first)["transferred"] == image.stat().st_size and not ok(first)["cached"]
    assert ok(again)["cached"] and json.loads((base.parent / "meta.json").read_text()) == {"key": key}
    assert ok(overlay) == {"path": str(disk), "created": True}
    assert ok(overlay_again) == {"path": str(disk), "created": False}
    assert ok(seed_at) == str(seed)
    assert ok(seeded) == {"seed": str(seed), "state": "attached"}
    assert ok(seed_mode) == "0600"
    assert ok(summary)["autostart"] is False  # step 5 sets it (storevirt.set_autostart)
    assert ok(summary)["backing"] == str(base) and ok(summary)["seed"] == {
        "minion_id": VM, "store_id": "0036", "state": "attached", "attached": True}
    assert ok(missing) is None
    assert ok(inspected)["base_images"] == {key: True, "nokey": False}
    assert ok(inspected)["domains"][VM]["disk"] == str(disk)
    # a region's read names no store: every domain of the host, the keys asked for
    # (libvirt's test driver defines a domain "test" of its own)
    assert ok(every)["every_domain"] and set(ok(every)["domains"]) == {VM, "test"}
    assert ok(every)["domains"][VM] == ok(inspected)["domains"][VM]
    assert ok(every)["base_images"] == {key: True}
    # the test driver cannot eject a CD-ROM: the call got as far as libvirt, with 3.6 code
    assert not retired["ok"] and "virDomainUpdateDeviceFlags" in retired["error"]
    assert ok(removed) == {"domain": True, "disk_dir": True, "data_kept": None}


def test_step5_domain_calls_survive_another_domain_stopping(tmp_path: Path) -> None:
    """Another domain of the host stops while step 5 marks its VM autostart (a power cut of
    another store's host on the lab's one libvirtd, a reset on a real host): Salt's
    virt.set_autostart, which looks every running domain up by id first, fails; storevirt's
    calls, by name, do not."""
    other = "store-0037-vm"
    calls = [
        {"fun": "virt.set_autostart", "args": [VM], "kwargs": {"state": "on"}},
        {"fun": "storevirt.set_autostart", "args": [VM]},
        {"fun": "storevirt.reset", "args": [VM]},
        {"fun": "storevirt.domain_summary", "args": [VM]},
        {"fun": "storevirt.stop", "args": [VM]},
        {"fun": "storevirt.stop", "args": [VM]},
        {"fun": "storevirt.domain_summary", "args": [VM]},
        {"fun": "storevirt.set_autostart", "args": ["store-0038-vm"]},
    ]
    seed = tmp_path / "seed.iso"
    domains = (domain_xml(tmp_path / "disk.qcow2", seed),
               domain_xml(tmp_path / "other.qcow2", seed).replace(VM, other))
    (salts, marked, reset, running, stopped, again, summary, missing) = run_on_host_python(
        tmp_path, calls, define=domains, start=[VM, other], stop_during_listing=[other])
    assert not salts["ok"] and "Domain not found" in salts["error"], salts  # the other one
    assert ok(marked) is True and ok(reset) is True and ok(running)["active"] is True
    assert ok(stopped) is True and ok(again) is True
    assert ok(summary)["autostart"] is True and ok(summary)["active"] is False
    assert not missing["ok"] and 'The VM "store-0038-vm" is not present' in missing["error"]


def test_a_failed_overlay_says_why_under_the_store_hosts_python(tmp_path: Path) -> None:
    """The error paths run there too: an overlay on another base is refused with its reason."""
    images = tmp_path / "images"
    for name in ("a", "b"):
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(tmp_path / f"{name}.qcow2"),
                        "8M"], check=True)
    first, other = run_on_host_python(tmp_path, [
        {"fun": "storevirt.create_overlay", "args": [VM, str(tmp_path / "a.qcow2")]},
        {"fun": "storevirt.create_overlay", "args": [VM, str(tmp_path / "b.qcow2")]},
    ])
    assert ok(first)["created"]
    assert not other["ok"] and "exists on another base image" in other["error"], other
    assert (images / VM / "system.qcow2").exists()


def test_storehost_and_its_states_run_under_the_store_hosts_python(tmp_path: Path) -> None:
    grub = tmp_path / "grub.cfg"
    grub.write_text("menuentry 'openSUSE Leap 15.6' {\n}\n"
                    "menuentry 'openSUSE Leap 15.6, with Xen hypervisor' --class xen {\n}\n")
    caps = tmp_path / "capabilities"
    caps.write_text("control_d\n")
    results = run_on_host_python(tmp_path, [
        {"fun": "storehost.xen_boot_entry", "args": [str(grub)]},
        {"fun": "storehost.xen_boot_entry", "args": [str(tmp_path / "none.cfg")]},
        {"fun": "storehost.is_dom0", "args": [str(caps)]},
        {"fun": "storehost.is_dom0", "args": [str(tmp_path / "none")]},
        {"fun": "storehost.libvirt_driver"},
        {"fun": "storehost.bridge_problems", "args": [{"name": "lo", "bootproto": "static",
                                                        "address": "192.0.2.9",
                                                        "netmask": "255.255.255.0"}]},
        {"fun": "storehost.check", "kwargs": {"driver": "TEST", "require_dom0": False,
                                              "tools": ["qemu-img", "xorriso"]}},
        {"fun": "storehost.checked", "state": True, "args": ["hypervisor-checks"],
         "kwargs": {"driver": "TEST", "require_dom0": False, "tools": ["qemu-img"]}},
        {"fun": "storehost.checked", "state": True, "args": ["hypervisor-checks"],
         "kwargs": {"driver": "Xen", "require_dom0": True}},
        # sle16-kvm's device check (/dev/kvm), here on paths of the test's own
        {"fun": "storehost.checked", "state": True, "args": ["hypervisor-checks"],
         "kwargs": {"driver": "TEST", "require_dom0": False, "devices": [str(caps)]}},
        {"fun": "storehost.checked", "state": True, "args": ["hypervisor-checks"],
         "kwargs": {"driver": "TEST", "require_dom0": False,
                    "devices": [str(tmp_path / "kvm")]}},
    ])
    (entry, no_grub, dom0, not_dom0, driver, lo, check, checked, refused, device,
     no_device) = results
    assert ok(entry) == "openSUSE Leap 15.6, with Xen hypervisor"
    assert not no_grub["ok"] and "cannot read" in no_grub["error"]
    assert ok(dom0) is True and ok(not_dom0) is False
    assert ok(driver) == "TEST"
    assert ok(lo) == ["bridge lo has 127.0.0.1/8, not the inventory's static 192.0.2.9/24"], lo
    assert ok(check) == {"driver": "TEST", "dom0": False, "tools": ["qemu-img", "xorriso"],
                         "bridge": None, "devices": []}, check
    assert ok(checked)["result"] is True, checked
    assert ok(refused)["result"] is False and "Xen" in ok(refused)["comment"], refused
    assert ok(device)["result"] is True and str(caps) in ok(device)["comment"], device
    assert ok(no_device)["result"] is False, no_device
    assert f"devices missing: {tmp_path / 'kvm'}" in ok(no_device)["comment"], no_device


def test_provisioning_runs_and_refuses_under_the_store_hosts_python(tmp_path: Path) -> None:
    """Outside a real root (a minion with its own root_dir), reboot and restart refuse
    instead of touching the machine: the path a lab without a simulator takes."""
    bootstrap, root, reboot, restart = run_on_host_python(tmp_path, [
        {"fun": "provisioning.bootstrap_files"},
        {"fun": "provisioning.root_path", "args": ["etc", "salt"]},
        {"fun": "provisioning.reboot", "args": ["firstboot"]},
        {"fun": "provisioning.restart_minion", "args": ["config"]},
    ])
    assert ok(bootstrap) and all(isinstance(path, str) for path in ok(bootstrap))
    assert ok(root) == str(tmp_path / "minion-root" / "etc" / "salt")
    for refused in (reboot, restart):
        assert not refused["ok"] and "CommandExecutionError" in refused["error"], refused


def test_the_go_live_checks_run_under_the_store_hosts_python(
        tmp_path: Path, image_server: tuple[str, Path]) -> None:
    """`storegate.run` as a store server's minion on Leap (Salt 3006.0, Python 3.6) runs it,
    from the role's config file under its root: a service answering HTTP, one whose port is
    closed, free disk and the clock. (Units are the lab's and the full lab's: test_go_live.)"""
    import time

    from lab.procs import free_port
    from store_rollout.contracts import GO_LIVE_FUNCTION, STORE_SERVER_CONFIG

    url, _served = image_server
    config = tmp_path / "minion-root" / STORE_SERVER_CONFIG
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({
        "services": {"pos": {"port": int(url.rsplit(":", 1)[1]), "http": {"path": "/"}},
                     "sync": {"port": free_port()}},
        "go_live": {"disk": {"path": "/", "min_free_mb": 1},
                    "data_disk": {"path": DATA_DISK_MOUNT, "label": DATA_DISK_LABEL},
                    "clock": {"max_skew_seconds": 30}}}))
    gate = {"fun": GO_LIVE_FUNCTION, "args": [STORE_SERVER_CONFIG, time.time()]}
    # the minion's private root stands for "/": its srv/store is the data disk's content
    mounted = {"fun": "storedata.mounted", "state": True, "args": [DATA_DISK_MOUNT, DATA_DISK_LABEL]}
    without, not_mounted = run_on_host_python(tmp_path, [gate, mounted])
    (tmp_path / "minion-root" / DATA_DISK_MOUNT.lstrip("/")).mkdir(parents=True)
    checks, state = run_on_host_python(tmp_path, [gate, mounted])
    verdicts = {row["check"]: row["passed"] for row in ok(checks)}
    assert verdicts == {f"pos port {url.rsplit(':', 1)[1]} answers": True,
                        "pos answers HTTP 200": True,
                        f"sync port {json.loads(config.read_text())['services']['sync']['port']} "
                        "answers": False,
                        "disk / has 1 MB free": True,
                        f"data disk {DATA_DISK_MOUNT} mounted and writable": True,
                        "clock within 30 s of the master's": True}, ok(checks)
    data_row = next(r for r in ok(checks) if r["kind"] == "data_disk")
    assert data_row["observed"].endswith("(present), writable"), data_row
    assert ok(state)["result"] is True, ok(state)
    # no data disk: the gate's row fails saying so, and the formula's state fails
    assert {r["check"]: (r["passed"], r["observed"]) for r in ok(without)}[
        f"data disk {DATA_DISK_MOUNT} mounted and writable"] == (
        False, f"the simulated machine's {DATA_DISK_MOUNT} (missing)")
    assert ok(not_mounted)["result"] is False and DATA_DISK_LABEL in ok(not_mounted)["comment"]


def test_the_data_disk_export_under_the_store_hosts_python(tmp_path: Path) -> None:
    """`storedata.export_data_disk` as a store host's minion (Salt 3006.0, Python 3.6) runs it:
    the stopped VM's sparse data.raw packed with the host's GNU tar, its sha256 computed; a
    limit below the archive's size refuses it (nothing left); a VM without one says so."""
    disk = tmp_path / "images" / VM / "data.raw"
    disk.parent.mkdir(parents=True)
    with disk.open("wb") as handle:
        handle.truncate(32 << 20)
        handle.write(b"journal")
    too_big, made, none = run_on_host_python(tmp_path, [
        {"fun": "storedata.export_data_disk", "args": [VM], "kwargs": {"max_bytes": 8}},
        {"fun": "storedata.export_data_disk", "args": [VM]},
        {"fun": "storedata.export_data_disk", "args": ["store-0037-vm"]}])
    assert not too_big["ok"] and "file_recv_max_size" in too_big["error"], too_big
    archive = disk.parent / "data-export.tar.gz"
    assert ok(made)["path"] == str(archive) and ok(made)["data_disk"] == str(disk)
    assert ok(made)["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert (ok(made)["bytes"], ok(made)["data_disk_bytes"]) == (archive.stat().st_size, 32 << 20)
    assert ok(none) == {"exported": False, "data_disk": None}


ENGINE_RUNNER = REPO_ROOT / "tests" / "host36" / "run_engine.py"


def test_the_libvirt_events_engine_survives_a_lost_connection_under_the_store_hosts_python(
        tmp_path: Path) -> None:
    """The hypervisor's store_libvirt_events engine, loaded by Salt 3006.0's engine loader under
    Python 3.6 and started as the minion starts it, on libvirt's test driver: a close of its
    connection (reason EOF, from libvirt's event loop) sends `connection/lost`, the engine
    reconnects and sends `connection/restored` with the domains' states, and a domain event
    after that comes through Salt 3006.0's own libvirt_events callbacks. Each is signed with
    the minion's key by Salt 3006.0's salt.crypt, and the master's forwarder (Salt 3008)
    verifies it with the accepted public key
    (tests/unit/salt_states/test_signed_store_events.py)."""
    if not HOST_PY36.exists():
        pytest.fail(f"{HOST_PY36} missing: `make setup` builds it (needs CPython 3.6, README)")
    root = tmp_path / "minion-root"
    from tests.unit.salt_states.test_signed_store_events import key_pair

    key_pair(root / "etc/salt/pki")
    master_pki = tmp_path / "master-pki"
    (master_pki / "minions").mkdir(parents=True)
    (master_pki / "minions" / HV).write_bytes((root / "etc/salt/pki/minion.pub").read_bytes())
    opts = {"id": HV, "root_dir": str(root), "conf_file": str(root / "etc/salt/minion"),
            "cachedir": str(root / "var/cache/salt/minion"),
            "pki_dir": str(root / "etc/salt/pki"), "sock_dir": str(root / "var/run/salt"),
            "log_file": str(root / "minion.log"), "file_client": "local"}
    proc = subprocess.run([str(HOST_PY36), str(ENGINE_RUNNER)], input=json.dumps(
        {"opts": opts, "engines_dir": str(SALT_STATES_DIR / "_engines"), "timeout": 30}),
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["python"][:2] == [3, 6] and out["salt"] == "3006.0", out
    assert out["loaded"] and out["error"] is None, out
    prefix = f"{LIBVIRT_EVENT_TAG_PREFIX}/test/default/"
    assert [tag for tag, _ in out["events"]] == [
        prefix + LIBVIRT_CONNECTION_LOST, prefix + LIBVIRT_CONNECTION_RESTORED,
        prefix + "domain/lifecycle"], out["events"]
    forwarder = load_salt_module("_engines", "store_prefect_events")
    signed = forwarder.SignedEvents({"pki_dir": str(master_pki)})
    for tag, data in out["events"]:
        assert signed.verified(tag, {"id": HV, "data": data}), (tag, data)
        del data[STORE_EVENT_SIGNATURE]
    lost, restored, lifecycle = (data for _, data in out["events"])
    assert lost == {"uri": URI, "reason": "eof"}
    assert restored["reason"] == "eof" and restored["domains"] == {"test": "running"}
    assert restored["down_seconds"] >= 0.9  # it waited a second: that connection was brand new
    assert (lifecycle["domain"]["name"], lifecycle["event"], lifecycle["detail"]) \
        == ("test", "stopped", "destroyed")
    # the loss was answered: nothing left for a restarted engine to report
    assert not (root / "var/cache/salt/minion" / "store_libvirt_events.json").exists()


def host_python_paths() -> list[str]:
    """The paths `make lint` checks against Python 3.6 (the Makefile is their one source)."""
    for line in (REPO_ROOT / "Makefile").read_text().splitlines():
        if line.startswith("HOST_PYTHON_PATHS :="):
            return line.split(":=", 1)[1].split()
    raise AssertionError("Makefile has no HOST_PYTHON_PATHS")


def vermin(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "vermin"), "-q", "-t=3.6-",
                           "--violations", "--no-tips", *paths],
                          capture_output=True, text=True, cwd=REPO_ROOT, check=False)


def test_lint_checks_all_host_side_code_against_python_36(tmp_path: Path) -> None:
    paths = host_python_paths()
    assert {"salt_states/_modules", "salt_states/_states", "salt_states/_utils", "tests/host36",
            "salt_states/_engines/store_libvirt_events.py"} <= set(paths)
    clean = vermin(*paths)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    planted = tmp_path / "planted.py"
    planted.write_text("import subprocess\n"
                       "subprocess.run(['true'], capture_output=True, text=True)\n")
    flagged = vermin(str(planted))
    assert flagged.returncode != 0 and "capture_output" in flagged.stdout, flagged.stdout
