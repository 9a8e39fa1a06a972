"""The content-addressed image cache: ``<cache>/<key>/image.qcow2`` + ``meta.json``.

:func:`image_key` is the content address (description tree + parameters + builder); a hit
does no KIWI work; concurrent misses for one key build once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tasks.kiwi.errors import KiwiDescriptionError
from tasks.kiwi.models import Builder, ImageRef, LineSink
from tasks.kiwi.params import DEFAULT_PARAMS, resolve_params

__all__ = ["ImageCache", "file_sha256", "image_key"]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def image_key(desc_dir: Path, params: Mapping[str, str], *, builder: str | None = None) -> str:
    """Content address of an image: sha256 over the description tree and the build params.

    Hashes every path (relative), file mode and file content under ``desc_dir``, following
    symlinks (so the shared ``root -> ../overlays/salt-minion`` overlay counts), then the
    effective parameters (defaults applied) sorted by key, then ``builder`` if given.

    Example:
        >>> key = image_key(IMAGE_BUILDS_DIR / "leap16-jeos", {"SALT_MASTER": "10.0.0.1"})
        >>> len(key)
        64
    """
    desc_dir = Path(desc_dir)
    h = hashlib.sha256(b"store-rollout image key v1\0")
    seen: set[Path] = set()

    def walk(directory: Path, rel: str) -> None:
        real = directory.resolve()
        if real in seen:
            raise KiwiDescriptionError(desc_dir, [f"{directory}: symlink loop"])
        seen.add(real)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            rel_path = f"{rel}{entry.name}"
            st = path.stat()  # follows symlinks
            if stat.S_ISDIR(st.st_mode):
                h.update(f"D {rel_path}/ {stat.S_IMODE(st.st_mode):o}\0".encode())
                walk(path, f"{rel_path}/")
            elif stat.S_ISREG(st.st_mode):
                h.update(f"F {rel_path} {stat.S_IMODE(st.st_mode):o} {st.st_size}\0".encode())
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                h.update(b"\0")
        seen.discard(real)

    walk(desc_dir, "")
    effective = {**DEFAULT_PARAMS, **params}
    h.update(json.dumps(sorted(effective.items())).encode())
    if builder is not None:
        h.update(f"\0builder {builder}".encode())
    return h.hexdigest()


class ImageCache:
    """Content-addressed image store: ``<cache>/<key>/image.qcow2`` + ``meta.json``.

    Entries appear atomically (built in ``<cache>/.tmp-*`` then renamed); concurrent
    :meth:`ensure` calls for one key serialise on an ``fcntl`` lock ``<cache>/<key>.lock``.
    """

    IMAGE = "image.qcow2"
    META = "meta.json"

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)

    def entry(self, key: str) -> Path:
        """Directory of a cache entry (it may not exist)."""
        return self.cache_dir / key

    def meta(self, key: str) -> dict[str, Any] | None:
        """The entry's meta.json, or None when the key is not cached."""
        try:
            data: dict[str, Any] = json.loads(
                (self.entry(key) / self.META).read_text(encoding="utf-8")
            )
        except (OSError, ValueError):
            return None
        return data if (self.entry(key) / self.IMAGE).is_file() else None

    def _with_digest(self, key: str) -> dict[str, Any]:
        """The entry's meta, given its image's sha256 and size once if an older cache lacks
        them (hypervisors verify their downloads against it)."""
        meta = self.meta(key) or {}
        if "sha256" not in meta:
            with self._locked(key):
                meta = self.meta(key) or {}
                if "sha256" not in meta:
                    image = self.entry(key) / self.IMAGE
                    meta.update(sha256=file_sha256(image), size=image.stat().st_size)
                    tmp = self.entry(key) / f".{self.META}.tmp"
                    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
                    os.replace(tmp, self.entry(key) / self.META)
        return meta

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        fd = os.open(self.cache_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def lookup(self, desc_dir: Path, params: Mapping[str, str], builder: Builder) -> tuple[
            str, dict[str, Any] | None]:
        """The key `ensure` would use and its meta.json, None on a miss; builds nothing."""
        desc_dir = Path(desc_dir)
        key = image_key(desc_dir, resolve_params(desc_dir, params), builder=builder.tag)
        return key, self.meta(key)

    def ensure(
        self,
        desc_dir: Path,
        params: Mapping[str, str],
        builder: Builder,
        *,
        log: LineSink | None = None,
    ) -> ImageRef:
        """Return the cached image for (description, params, builder), building on a miss.

        A hit does no KIWI work at all (``kiwi_seconds == 0``).

        Raises:
            BuildParamsError: Parameters do not fit the description's placeholders.
            KiwiDescriptionError / KiwiBuildError: From the builder on a miss.
        """
        sink: LineSink = log or (lambda line: None)
        started = time.monotonic()
        desc_dir = Path(desc_dir)
        effective = resolve_params(desc_dir, params)
        key = image_key(desc_dir, effective, builder=builder.tag)
        if self.meta(key) is None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with self._locked(key):
                if self.meta(key) is None:
                    return self._build(desc_dir, effective, builder, key, sink, started)
        sink(f"image cache hit {key}")
        return ImageRef(
            key=key,
            path=self.entry(key) / self.IMAGE,
            meta=self._with_digest(key),
            cache_hit=True,
            build_seconds=0.0,
            kiwi_seconds=0.0,
            seconds=time.monotonic() - started,
        )

    def _build(
        self,
        desc_dir: Path,
        params: dict[str, str],
        builder: Builder,
        key: str,
        sink: LineSink,
        started: float,
    ) -> ImageRef:
        sink(f"image cache miss {key}: building {desc_dir.name} with {builder.tag}")
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.cache_dir))
        try:
            work = staging / "work"
            work.mkdir()
            build_started = time.monotonic()
            out = builder.build(desc_dir, params, work, sink)
            os.replace(out.image, staging / self.IMAGE)
            for name, path in out.extra_files.items():
                shutil.copy2(path, staging / name)
            shutil.rmtree(work)
            build_seconds = time.monotonic() - build_started
            meta = {
                "key": key,
                # what a hypervisor verifies its download against (storevirt.ensure_base_image)
                "sha256": file_sha256(staging / self.IMAGE),
                "size": (staging / self.IMAGE).stat().st_size,
                "description": desc_dir.name,
                "image_name": out.image_name,
                "params": params,
                "built_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "builder": builder.tag,
                "build_seconds": round(build_seconds, 3),
                "kiwi_seconds": round(out.kiwi_seconds, 3),
                "kiwi_result": out.kiwi_result,
            }
            (staging / self.META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            target = self.entry(key)
            if target.exists():  # a half entry without meta.json (manual tampering)
                shutil.rmtree(target)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return ImageRef(
            key=key,
            path=target / self.IMAGE,
            meta=meta,
            cache_hit=False,
            build_seconds=build_seconds,
            kiwi_seconds=out.kiwi_seconds,
            seconds=time.monotonic() - started,
        )
