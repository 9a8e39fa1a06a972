"""tasks/kiwi/builders.py: the kiwi-ng command line, the minion wheelhouse, and (opt-in, root) a
real kiwi-ng build of lab-debian through the cache, its minion.d, Salt and first-boot identity
checked and the image booted under qemu."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.image_builder import render_minion_d
from lab.state import REPO_ROOT
from tasks.kiwi import (
    BUILD_PARAMS_FILE,
    ImageCache,
    KiwiBuilder,
    KiwiBuildError,
)
from tasks.kiwi.overlay import MINION_LOCK, MINION_WHEELHOUSE
from tests.helpers import cannot_run, load_salt_module
from tests.kiwi_helpers import DEBIAN, PARAMS, desc_dir


def test_kiwi_builder_command_line(tmp_path: Path) -> None:
    b = KiwiBuilder(shared_cache_dir=tmp_path / "shared", kiwi_ng="kiwi-ng")
    cmd = b.command(tmp_path / "desc", "Disk", tmp_path / "work")
    assert cmd[:3] == ["kiwi-ng", "--profile", "Disk"]
    assert cmd.index("system") > cmd.index("--shared-cache-dir") > cmd.index("--logfile")
    assert cmd[cmd.index("--temp-dir") + 1] == str(tmp_path / "work/kiwi-tmp")
    assert cmd[-4:] == ["--description", str(tmp_path / "desc"),
                        "--target-dir", str(tmp_path / "work/target")]  # fmt: skip


# a stand-in for `python -m pip`: records its argv, writes one wheel per pinned line of the lock,
# or fails like pip when a line names FAIL
FAKE_PIP = """import pathlib, sys
args = sys.argv[1:]
pathlib.Path(sys.argv[0]).with_name("argv.txt").write_text("\\n".join(args))
lock = pathlib.Path(args[args.index("--requirement") + 1]).read_text().splitlines()
out = pathlib.Path(args[args.index("--wheel-dir") + 1])
for line in lock:
    if line.startswith("FAIL"):
        sys.exit("ERROR: No matching distribution found for " + line)
    if "==" in line and not line.startswith("#"):
        name, version = line.split("==")
        (out / f"{name}-{version}-py3-none-any.whl").write_text("wheel")
"""


def _fake_pip(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake-pip" / "pip.py"
    script.parent.mkdir()
    script.write_text(FAKE_PIP)
    return [shutil.which("python3") or "python3", str(script)]


def test_wheelhouse_of_the_minion_lock_lands_in_the_overlay(tmp_path: Path) -> None:
    desc = tmp_path / "desc"
    (desc / "root").mkdir(parents=True)
    (desc / MINION_LOCK).write_text("# pins\nsalt==3006.30\npyzmq==27.3.0\n")
    pip = _fake_pip(tmp_path)
    wheelhouse = KiwiBuilder.add_wheelhouse(desc, pip=pip)
    assert wheelhouse == desc / "root" / MINION_WHEELHOUSE
    assert sorted(p.name for p in wheelhouse.iterdir()) == [
        MINION_LOCK, "pyzmq-27.3.0-py3-none-any.whl", "salt-3006.30-py3-none-any.whl"]
    argv = (tmp_path / "fake-pip" / "argv.txt").read_text().splitlines()
    assert argv[:3] == ["wheel", "--quiet", "--no-deps"]  # the lock pins every package
    # no lock: a description with a packaged minion (leap16-jeos: the Salt Bundle) gets no wheelhouse
    (desc / MINION_LOCK).unlink()
    shutil.rmtree(desc / "root")
    assert KiwiBuilder.add_wheelhouse(desc, pip=pip) is None
    assert not (desc / "root").exists()


def test_wheelhouse_failure_names_the_lock_and_pips_reason(tmp_path: Path) -> None:
    desc = tmp_path / "desc"
    desc.mkdir()
    (desc / MINION_LOCK).write_text("salt==3006.30\nFAIL-pkg==1\n")
    with pytest.raises(KiwiBuildError) as err:
        KiwiBuilder.add_wheelhouse(desc, pip=_fake_pip(tmp_path))
    assert MINION_LOCK in str(err.value) and "No matching distribution found for FAIL-pkg" in str(
        err.value)


def test_image_minion_pins_are_the_store_hosts_salt() -> None:
    """lab-debian's Salt is requirements-salt3006.lock's (Leap 15.6's line) minus libvirt-python,
    and config.sh installs it from the wheelhouse path the builder fills."""
    def pins(path: Path) -> dict[str, str]:
        lines = [line for line in path.read_text().splitlines() if line and line[0] != "#"]
        return dict(line.lower().split("==") for line in lines)
    image = pins(desc_dir(DEBIAN) / MINION_LOCK)
    hosts = pins(REPO_ROOT / "requirements-salt3006.lock")
    assert image == {k: v for k, v in hosts.items() if k != "libvirt-python"}
    config_sh = (desc_dir(DEBIAN) / "config.sh").read_text()
    assert f"wheelhouse=/{MINION_WHEELHOUSE}\n" in config_sh
    assert f'"$wheelhouse/{MINION_LOCK}"' in config_sh


# --------------------------------------------------------------------------- real build (opt-in)


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def mounted_root(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Mount a raw disk image read-only; umount/partx -d/losetup -d even on failure."""
    cleanup: list[list[str]] = []

    def mount(raw: Path) -> Path:
        loop = _run("losetup", "-r", "-f", "--show", str(raw))
        cleanup.append(["losetup", "-d", loop])
        subprocess.run(["partx", "-a", loop], check=False, capture_output=True)
        cleanup.append(["partx", "-d", loop])
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        for part in sorted(Path("/dev").glob(f"{Path(loop).name}p*")):
            if subprocess.run(["mount", "-o", "ro", str(part), str(mnt)],
                              capture_output=True).returncode != 0:  # fmt: skip
                continue
            if (mnt / "etc/salt/minion.d").is_dir():
                cleanup.append(["umount", str(mnt)])
                return mnt
            subprocess.run(["umount", str(mnt)], check=True)
        raise AssertionError(f"no partition of {raw} holds etc/salt/minion.d")

    try:
        yield mount
    finally:
        for cmd in reversed(cleanup):
            subprocess.run(cmd, check=False, capture_output=True)


def _wait_for(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            raise AssertionError(f"no {needle!r} within {timeout} s; console tail:\n"
                                 f"{out[-3000:].decode(errors='replace')}")  # fmt: skip
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if ready:
            out += os.read(proc.stdout.fileno(), 65536)
    return out


@pytest.mark.kiwi_build
@pytest.mark.timeout(1800)
def test_real_kiwi_build_of_lab_debian_boots(
    tmp_path: Path, mounted_root: Callable[[Path], Path]
) -> None:
    if os.geteuid() != 0:
        cannot_run("kiwi-ng system build needs root (loop devices, chroot, mounts)")
    for tool in ("qemu-system-x86_64", "losetup", "partx", "rsync"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} not installed")
    cache_dir = Path(os.environ.get("STORE_ROLLOUT_KIWI_TEST_CACHE", tmp_path / "cache"))
    params = {**PARAMS, "KIWI_PROFILE": "Disk"}
    builder = KiwiBuilder(shared_cache_dir=cache_dir / "_kiwi-shared-cache")
    lines: list[str] = []
    ref = ImageCache(cache_dir).ensure(desc_dir(DEBIAN), params, builder,
                                       log=lines.append)  # fmt: skip
    assert ref.path.is_file()
    assert json.loads(_run("qemu-img", "info", "--output=json", str(ref.path)))["format"] == "qcow2"

    # minion.d inside the image == render_minion_d, mode 0640, build-only files gone
    raw = tmp_path / "disk.raw"
    _run("qemu-img", "convert", "-O", "raw", str(ref.path), str(raw))
    root = mounted_root(raw)
    minion_d = root / "etc/salt/minion.d"
    expected = render_minion_d(desc_dir(DEBIAN), params)
    assert {p.name: p.read_text() for p in minion_d.iterdir()} == expected
    assert all(p.stat().st_mode & 0o777 == 0o640 for p in minion_d.iterdir())
    assert (root / "usr/local/sbin/store-identity").is_file()
    assert not (root / BUILD_PARAMS_FILE).exists()
    assert not (root / "etc/salt/minion_id").exists()
    # a real minion, started after store-identity; no identity of any machine baked in
    assert (root / "opt/salt/bin/salt-minion").is_file()
    assert not (root / MINION_WHEELHOUSE).exists()
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "salt-minion.service").is_symlink()
    assert (root / "etc/systemd/system/salt-minion.service.requires/store-identity.service"
            ).is_symlink()
    assert (root / "etc/machine-id").read_text() == ""
    assert not list((root / "etc/ssh").glob("ssh_host_*"))
    assert not (root / "etc/salt/pki").exists()

    # boot a throwaway overlay under TCG with its identity seed and user-mode networking: the
    # seed's identity reaches the minion, which starts (no master here: only its start is
    # checked; the full lab checks the rest)
    disk = tmp_path / "boot.qcow2"
    _run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(ref.path),
         str(disk))  # fmt: skip
    seed = tmp_path / "seed.iso"
    load_salt_module("_utils", "store_seed_iso").write_seed(str(seed), {
        "minion_id": "kiwi-test-vm", "autosign_token": "0123abcd", "store_id": "kiwi-test"})
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2",
         "-nographic", "-no-reboot", "-nic", "user,model=virtio-net-pci",
         "-drive", f"file={disk},if=virtio,format=qcow2",
         "-drive", f"file={seed},media=cdrom,format=raw,readonly=on"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        console = re.sub(rb"\x1b\[[0-9;]*m", b"", _wait_for(qemu, b"login:", 300))
        # systemd's status lines, colours stripped (it shortens long unit names with "...")
        for done in (rb"Finished store-identity\.se", rb"Reached target network-online\.target",
                     rb"Started salt-minion\.servic"):
            assert re.search(done, console), (done, console[-3000:])
    finally:
        qemu.kill()
        qemu.wait(30)
