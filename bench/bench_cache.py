"""Second rollout with an unchanged image description: seconds spent in KIWI (cache hit),
against the first (miss). Prints one JSON object."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from common import emit, machine

from lab.state import LAB_IMAGE_DESCRIPTION
from tasks.kiwi import ImageCache, make_builder, resolve_description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--description", default=str(LAB_IMAGE_DESCRIPTION),
                        help="a name under image_builds/ or a description's directory")
    parser.add_argument("--builder", default="lab", choices=["lab", "kiwi"])
    args = parser.parse_args()
    cache_dir = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        cache = ImageCache(cache_dir)
        desc = resolve_description(args.description)
        params = {"SALT_MASTER": "salt.bench.invalid"}
        runs = []
        for _ in range(2 if args.quick else 3):
            started = time.perf_counter()
            ref = cache.ensure(desc, params, make_builder(args.builder, cache_dir))
            runs.append({"hit": ref.cache_hit, "kiwi": ref.kiwi_seconds,
                         "seconds": time.perf_counter() - started})
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    emit({"benchmark": "cache", "description": desc.name, "builder": args.builder,
          "first_hit": runs[0]["hit"], "first_kiwi_seconds": runs[0]["kiwi"],
          "first_seconds": runs[0]["seconds"],
          "second_hit": runs[1]["hit"], "second_kiwi_seconds": runs[1]["kiwi"],
          "second_seconds": runs[1]["seconds"], "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
