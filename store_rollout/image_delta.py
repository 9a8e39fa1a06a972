"""The image server's delta of a base image: a qcow2 overlay whose backing is the previous
version's image, holding only the clusters that differ, and the digest of the full image's
guest-visible content that the host checks its rebuild against
(salt_states/_utils/store_image_delta.py)."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
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
