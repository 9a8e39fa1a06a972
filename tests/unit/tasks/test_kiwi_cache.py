"""tasks/kiwi/cache.py: image keys and the image cache (hits without KIWI, one build per key
under concurrency, nothing left behind by a failed build)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from lab.image_builder import HALT_BOOT_SECTOR, LabBuilder
from tasks.kiwi import (
    BuildOutput,
    BuildParamsError,
    ImageCache,
    KiwiDescriptionError,
    image_key,
)
from tests.kiwi_helpers import (
    DEBIAN,
    LEAP,
    PARAMS,
    SHARED_OVERLAY,
    copy_description,
    copy_tree_with_links,
    desc_dir,
    edit,
    no_version,
)

# --------------------------------------------------------------------------- image_key


def test_image_key_stable_and_sensitive_to_overlay_and_params(tmp_path: Path) -> None:
    tree = copy_tree_with_links(tmp_path)
    desc = desc_dir(LEAP, tree)
    k1 = image_key(desc, PARAMS)
    assert k1 == image_key(desc, PARAMS) == image_key(desc, dict(reversed(PARAMS.items())))
    assert re.fullmatch(r"[0-9a-f]{64}", k1)
    # same tree content elsewhere -> same key (relative paths only)
    assert image_key(desc_dir(LEAP), PARAMS) == k1
    # defaults are applied before hashing
    assert image_key(desc, {"SALT_MASTER": "10.20.0.1"}) == k1

    assert image_key(desc, {**PARAMS, "SALT_MASTER": "10.20.0.2"}) != k1
    assert image_key(desc, {**PARAMS, "LAB_DISK_SIZE": "128M"}) != k1
    assert image_key(desc, PARAMS, builder="lab-v2") != k1

    # one shared overlay file changes -> the key of BOTH descriptions changes
    k_debian = image_key(desc_dir(DEBIAN, tree), PARAMS)
    conf = tree / SHARED_OVERLAY / "etc/salt/minion.d/10-grains.conf"
    edit(conf, "role: store-server", "role: store-server-x")
    k2 = image_key(desc, PARAMS)
    assert k2 != k1 and image_key(desc_dir(DEBIAN, tree), PARAMS) != k_debian
    # a mode change counts too
    conf.chmod(0o600)
    assert image_key(desc, PARAMS) != k2


# --------------------------------------------------------------------------- ImageCache


class CountingLabBuilder(LabBuilder):
    """LabBuilder that counts build() calls and can be slowed down to widen races."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.calls = 0
        self.delay = delay
        self._lock = threading.Lock()

    def build(self, desc_dir: Path, params: Mapping[str, str], work_dir: Path,
              log: Callable[[str], None]) -> BuildOutput:  # fmt: skip
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        return super().build(desc_dir, params, work_dir, log)


def test_cache_miss_then_hit_without_kiwi(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    builder = CountingLabBuilder()
    first = cache.ensure(desc_dir(DEBIAN), {**PARAMS, "KIWI_PROFILE": "Disk"}, builder)
    assert not first.cache_hit and builder.calls == 1 and first.kiwi_seconds > 0
    assert first.path == tmp_path / "cache" / first.key / "image.qcow2"

    info = json.loads(subprocess.run(
        ["qemu-img", "info", "--output=json", str(first.path)],
        check=True, capture_output=True, text=True).stdout)  # fmt: skip
    assert info["format"] == "qcow2" and info["virtual-size"] == 64 * 1024 * 1024
    # its one sector of content: a boot sector that halts the guest's CPU (an idle lab VM)
    raw = tmp_path / "first.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(first.path), str(raw)], check=True)
    assert raw.read_bytes()[:512] == HALT_BOOT_SECTOR
    assert raw.read_bytes()[512:].count(0) == 64 * 1024 * 1024 - 512

    meta = json.loads((first.path.parent / "meta.json").read_text())
    assert meta["key"] == first.key and meta["description"] == DEBIAN
    assert meta["params"]["SALT_MASTER"] == "10.20.0.1" and meta["builder"] == "lab-v2"
    assert {"built_at", "build_seconds", "kiwi_result"} <= set(meta)
    assert meta["kiwi_result"]["validated"]["name"] == "lab-debian12-store-server"

    second = cache.ensure(desc_dir(DEBIAN), {**PARAMS, "KIWI_PROFILE": "Disk"}, builder)
    assert second.cache_hit and second.key == first.key and second.path == first.path
    assert builder.calls == 1 and second.kiwi_seconds == 0 and second.build_seconds == 0
    # nothing left behind but the entry and its lock
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        first.key,
        f"{first.key}.lock",
    ]


def test_cache_concurrent_ensure_builds_once(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    builder = CountingLabBuilder(delay=0.5)
    barrier = threading.Barrier(2)
    refs = []

    def run() -> None:
        barrier.wait()
        refs.append(cache.ensure(desc_dir(LEAP), PARAMS, builder))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert builder.calls == 1
    assert sorted(r.cache_hit for r in refs) == [False, True]
    assert refs[0].path == refs[1].path and refs[0].path.is_file()


def test_cache_failed_build_leaves_no_entry(tmp_path: Path) -> None:
    desc = copy_description(LEAP, tmp_path)
    no_version(desc)
    cache = ImageCache(tmp_path / "cache")
    with pytest.raises(KiwiDescriptionError, match="No version is defined"):
        cache.ensure(desc, PARAMS, LabBuilder())
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".lock"]


def test_cache_rejects_missing_params_before_building(tmp_path: Path) -> None:
    builder = CountingLabBuilder()
    with pytest.raises(BuildParamsError, match="no value for @SALT_MASTER@"):
        ImageCache(tmp_path / "cache").ensure(desc_dir(LEAP), {}, builder)
    assert builder.calls == 0
