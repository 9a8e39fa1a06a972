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

OLD, NEW = "0a" * 32, "0b" * 32  # image keys: sha256 hex digests


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


class HostMaster:
    """A master whose one hypervisor runs storevirt.ensure_base_image in this process (the
    utils modules as storevirt calls them), with images under `hv`."""

    def __init__(self, hv: Path) -> None:
        self.deliver = deliver(hv)
        self.kwargs: dict = {}

    def cmd(self, minion_id: str, fun: str, args: list, kwarg: dict, **_: object) -> dict:
        assert fun == "storevirt.ensure_base_image"
        self.kwargs = kwarg
        return self.deliver(*args, **kwarg)


def orchestrated(tmp_path: Path, old_on_host: bool, tamper: bool = False) -> tuple[dict, dict]:
    """tasks.image_delivery.deliver_image offering the delta from the cache it serves."""
    from types import SimpleNamespace

    from store_rollout.inventory import parse_inventory
    from tasks.image_delivery import deliver_image

    srv_root, hv, sha, _made, _ = setup(tmp_path)
    for stale in (srv_root / NEW).glob("delta-*"):
        stale.unlink()  # the orchestrator makes (and records) its own
    if tamper:
        with (srv_root / NEW / "image.qcow2").open("r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            fh.write(b"\x01")
    store = parse_inventory({"stores": [{
        "store_id": "s1", "erp": {"site_code": "S1"},
        "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01"}}]}).get("s1")
    served = Served(srv_root)
    try:
        settings = SimpleNamespace(image_base_url=served.base, image_ca_bundle=None,
                                   image_rate_limit=None, image_cache_dir=str(srv_root))
        master = HostMaster(hv)
        if old_on_host:
            master.deliver(served.url(OLD), OLD, sha[OLD])
        image = {"key": NEW, "sha256": sha[NEW], "meta": {"key": NEW}}
        result = deliver_image(master, store, settings, image,  # type: ignore[arg-type]
                               old_key=OLD)
    finally:
        served.server.shutdown()
    return result, master.kwargs


def test_the_orchestrator_offers_the_delta_and_the_host_takes_it(tmp_path: Path) -> None:
    result, kwargs = orchestrated(tmp_path, old_on_host=True)
    assert kwargs["delta"]["source"].endswith(f"/{NEW}/delta-from-{OLD}.qcow2")
    assert set(kwargs["delta"]) == {"source", "sha256", "old_key", "content_sha256"}
    assert result["mode"] == "delta" and result["transferred"] < result["full_size"] / 4


def test_a_host_without_the_old_image_gets_the_full_one(tmp_path: Path) -> None:
    result, kwargs = orchestrated(tmp_path, old_on_host=False)
    assert "delta" in kwargs and result["mode"] == "full"
    assert result["transferred"] == result["full_size"]


def test_a_cached_image_unlike_its_build_is_never_made_a_delta(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(ValueError, match="does not match its build's sha256"):
        orchestrated_offer(tmp_path)
    # delivery offers no delta then (review: a delta that cannot be made costs the full
    # download, not the staging); the full download's own check refuses the tampered image
    from salt.exceptions import CommandExecutionError

    with pytest.raises(CommandExecutionError, match="sha256 mismatch"):
        orchestrated(tmp_path / "again", old_on_host=True, tamper=True)


def orchestrated_offer(tmp_path: Path) -> None:
    """offer_delta straight on a cache whose new image does not match its build's digest."""
    from store_rollout.image_delta import offer_delta

    for key in (OLD, NEW):
        (tmp_path / key).mkdir(parents=True)
        (tmp_path / key / "image.qcow2").write_bytes(key.encode())
    offer_delta(tmp_path, OLD, NEW, "0" * 64)


def test_an_old_key_that_is_no_image_key_offers_no_delta(tmp_path: Path) -> None:
    """The old key is the host's own report: a path is never looked up in the cache (review)."""
    from store_rollout.image_delta import offer_delta

    assert offer_delta(tmp_path, "/etc", NEW, "0" * 64) is None
    assert offer_delta(tmp_path, "../" + OLD[3:], NEW, "0" * 64) is None
