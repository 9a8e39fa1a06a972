"""The host's delta path (storevirt.ensure_base_image with `delta`): the delta is downloaded
through the same verified path, the image rebuilt from the cached old base and checked against
the server's content digest; a corrupt delta or a missing old image means the full download."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from store_rollout.image_delta import make_delta
from tests.helpers import load_salt_module
from tests.unit.salt_states.test_image_delivery import Served

OLD, NEW = "o" * 16, "n" * 16


def qcow2(path: Path, blocks: dict[int, bytes]) -> Path:
    raw = path.with_suffix(".raw")
    with raw.open("wb") as fh:
        fh.truncate(8 << 20)
        for offset, data in blocks.items():
            fh.seek(offset)
            fh.write(data)
    subprocess.run(["qemu-img", "convert", "-q", "-O", "qcow2", str(raw), str(path)], check=True)
    raw.unlink()
    return path


def setup(tmp_path: Path, corrupt: bool = False):
    common = os.urandom(4 << 20)
    srv_root = tmp_path / "srv"
    (srv_root / OLD).mkdir(parents=True)
    (srv_root / NEW).mkdir()
    old = qcow2(srv_root / OLD / "image.qcow2", {0: common})
    new = qcow2(srv_root / NEW / "image.qcow2", {0: common, 6 << 20: os.urandom(65536)})
    made = make_delta(old, new, srv_root / NEW / f"delta-from-{OLD}.qcow2")
    delta_file = srv_root / NEW / f"delta-from-{OLD}.qcow2"
    if corrupt:  # a delta whose data differs but whose file digest the server published
        with delta_file.open("r+b") as fh:
            fh.seek(-4096, os.SEEK_END)
            fh.write(b"\xff" * 4096)
    hv = tmp_path / "hv"
    sha = {k: hashlib.sha256((srv_root / k / "image.qcow2").read_bytes()).hexdigest()
           for k in (OLD, NEW)}
    return srv_root, hv, sha, made, hashlib.sha256(delta_file.read_bytes()).hexdigest()


def deliver(hv: Path):
    download = load_salt_module("_utils", "store_image_download")
    rebuild = load_salt_module("_utils", "store_image_delta").rebuild
    return functools.partial(download.ensure_base_image, str(hv), rebuild=rebuild)


def run(tmp_path: Path, corrupt: bool = False, old_on_host: bool = True) -> tuple[dict, Path]:
    srv_root, hv, sha, made, delta_sha = setup(tmp_path, corrupt)
    served = Served(srv_root)
    try:
        if old_on_host:
            deliver(hv)(served.url(OLD), OLD, sha[OLD])
        delta = {"source": f"{served.base}/{NEW}/delta-from-{OLD}.qcow2", "sha256": delta_sha,
                 "old_key": OLD, "content_sha256": made["content_sha256"]}
        result = deliver(hv)(served.url(NEW), NEW, sha[NEW], delta=delta)
    finally:
        served.server.shutdown()
    dest = hv / "base" / NEW / "image.qcow2"
    assert subprocess.run(["qemu-img", "compare", "-q", str(srv_root / NEW / "image.qcow2"),
                           str(dest)]).returncode == 0
    return result, dest


def test_delta_rebuilds_the_new_image(tmp_path: Path) -> None:
    result, dest = run(tmp_path)
    assert result["mode"] == "delta"
    assert result["transferred"] < result["full_size"] / 4
    assert not list(dest.parent.glob("delta-*")) and not list(dest.parent.glob("*.rebuild"))


def test_corrupt_delta_is_refused_then_full(tmp_path: Path) -> None:
    result, dest = run(tmp_path, corrupt=True)
    assert result["mode"] == "full" and "refused" in result["delta_refused"]
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == hashlib.sha256(
        (tmp_path / "srv" / NEW / "image.qcow2").read_bytes()).hexdigest()


def test_old_image_missing_means_full(tmp_path: Path) -> None:
    result, _ = run(tmp_path, old_on_host=False)
    assert result["mode"] == "full" and "delta_refused" not in result


def test_delta_through_storevirt_under_the_store_hosts_python(tmp_path: Path) -> None:
    """storevirt.ensure_base_image(delta=...) by Salt 3006.0's loader under Python 3.6: the
    rebuild is found as __utils__["store_image_delta.rebuild"] and its result is verified."""
    from tests.unit.salt_states.test_host_python36 import ok, run_on_host_python, synced_extensions

    srv_root, _hv, sha, made, delta_sha = setup(tmp_path)
    served = Served(srv_root)
    try:
        delta = {"source": f"{served.base}/{NEW}/delta-from-{OLD}.qcow2", "sha256": delta_sha,
                 "old_key": OLD, "content_sha256": made["content_sha256"]}
        synced_extensions(tmp_path / "extmods")
        first, second = run_on_host_python(tmp_path, [
            {"fun": "storevirt.ensure_base_image", "args": [served.url(OLD), OLD, sha[OLD]]},
            {"fun": "storevirt.ensure_base_image", "args": [served.url(NEW), NEW, sha[NEW]],
             "kwargs": {"delta": delta}}])
    finally:
        served.server.shutdown()
    assert ok(first)["mode"] == "full"
    assert ok(second)["mode"] == "delta", second
    assert subprocess.run(["qemu-img", "compare", "-q", str(srv_root / NEW / "image.qcow2"),
                           ok(second)["path"]]).returncode == 0
