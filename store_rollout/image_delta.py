"""The image server's delta of a base image: a qcow2 overlay whose backing is the previous
version's image, holding only the clusters that differ, and the digest of the full image's
guest-visible content that the host checks its rebuild against
(salt_states/_utils/store_image_delta.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

DELTA_CLUSTER_SIZE = 4096  # the smallest delta of 4, 16, 64 KiB in bench/bench_delta_image.py


def delta_name(old_key: str) -> str:
    """The delta's file name next to the new version's image.qcow2."""
    return f"delta-from-{old_key}.qcow2"


def content_sha256(image: Path) -> str:
    """sha256 of qcow2 `image`'s guest-visible bytes: what the host's rebuild must match."""
    with tempfile.TemporaryDirectory(dir=image.parent) as tmp:
        raw = Path(tmp) / "content.raw"
        subprocess.run(["qemu-img", "convert", "-q", "-O", "raw", str(image), str(raw)],
                       check=True, capture_output=True)
        with raw.open("rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()


def make_delta(old: Path, new: Path, out: Path, cluster_size: int = DELTA_CLUSTER_SIZE) -> dict:
    """Write `out` = `new` minus `old` and return its size and the new image's content sha256."""
    def run(*argv: str) -> None:
        subprocess.run(["qemu-img", *argv], check=True, capture_output=True)

    run("create", "-q", "-f", "qcow2", "-o", f"cluster_size={cluster_size}",
        "-b", str(new.resolve()), "-F", "qcow2", str(out))
    run("rebase", "-q", "-f", "qcow2", "-b", str(old.resolve()), "-F", "qcow2", str(out))
    return {"delta_bytes": out.stat().st_size, "full_bytes": new.stat().st_size,
            "content_sha256": content_sha256(new)}


IMAGE_KEY = re.compile(r"[0-9a-f]{64}")


def offer_delta(cache_dir: Path, old_key: str, new_key: str, new_sha256: str) -> dict | None:
    """The delta from cached image `old_key` to `new_key` (made once, beside the new image,
    atomically), as the host's storevirt.ensure_base_image takes it less its URL: {"file",
    "sha256", "old_key", "content_sha256"}; None when either image is not in the cache. The
    content digest comes from the new image only once its file matched `new_sha256` (the
    build's digest), so a delta never carries what a full download would refuse."""
    # the old key is the host's own report: only an image key (64 hex digits) names a cache entry
    if not IMAGE_KEY.fullmatch(old_key) or old_key == new_key:
        return None
    old, new = cache_dir / old_key / "image.qcow2", cache_dir / new_key / "image.qcow2"
    if not (old.is_file() and new.is_file()):
        return None
    delta = new.parent / delta_name(old_key)
    record = delta.with_suffix(".json")
    if not record.is_file():
        with new.open("rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != new_sha256:
                raise ValueError(f"image {new_key}: cached {new} does not match its build's "
                                 "sha256; rebuild it (remove the cache entry)")
        # a name of its own per maker (threads of one worker, workers sharing the cache)
        part = delta.with_name(f".{delta.name}.{os.getpid()}.{uuid.uuid4().hex}")
        made = make_delta(old, new, part)
        with part.open("rb") as fh:
            made["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
        os.replace(part, delta)
        tmp = record.with_name(f".{record.name}.{os.getpid()}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(made, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, record)
    made = json.loads(record.read_text(encoding="utf-8"))
    return {"file": delta.name, "sha256": made["sha256"], "old_key": old_key,
            "content_sha256": made["content_sha256"]}
