"""VM disk as a qcow2 overlay on the base image vs a full copy of it. Prints one JSON object.

The base image is a qcow2 holding `--size` of real (non-zero) data, like a JeOS image whose
blocks are allocated; overlay creation writes only metadata, a copy moves every block.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def make_base(path: Path, size_mib: int) -> None:
    raw = path.with_suffix(".raw")
    with open(raw, "wb") as out:
        chunk = os.urandom(1 << 20)
        for _ in range(size_mib):
            out.write(chunk)
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(path)], check=True)
    raw.unlink()


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="256 MiB base, fewer repeats")
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args()
    size = 256 if args.quick else args.size_mib
    repeats_overlay, repeats_copy = (3, 1) if args.quick else (7, 3)
    work = Path(tempfile.mkdtemp(prefix="bench-disk-", dir=args.dir))
    try:
        base = work / "base.qcow2"
        make_base(base, size)
        overlay_s, copy_s = [], []
        for i in range(repeats_overlay):
            dest = work / f"overlay-{i}.qcow2"
            overlay_s.append(timed(lambda d=dest: subprocess.run(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(d)],
                check=True)))
            os.sync()
        for i in range(repeats_copy):
            dest = work / f"copy-{i}.qcow2"

            def copy(d: Path = dest) -> None:
                shutil.copyfile(base, d)
                with open(d, "rb+") as fh:
                    os.fsync(fh.fileno())  # a copy is only done when it is on disk

            copy_s.append(timed(copy))
            dest.unlink()
        overlay_bytes = (work / "overlay-0.qcow2").stat().st_size
        result = {
            "benchmark": "disk",
            "base_image_mib": size,
            "base_image_bytes": base.stat().st_size,
            "overlay_seconds_median": round(statistics.median(overlay_s), 4),
            "copy_seconds_median": round(statistics.median(copy_s), 4),
            "copy_over_overlay_ratio": round(statistics.median(copy_s) / statistics.median(overlay_s), 1),
            "overlay_bytes": overlay_bytes,
            "repeats": {"overlay": repeats_overlay, "copy": repeats_copy},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "kernel": platform.release()},
            "quick": args.quick,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
