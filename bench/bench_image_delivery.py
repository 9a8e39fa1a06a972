"""Base image delivery to a hypervisor, rate-limited: first delivery, a delivery cut at ~50 %
and resumed, and a rerun. Prints one JSON object.

The lab's image server (`lab.image_server`, its own process) serves a `--size-mib` image;
the hypervisor side is the project's own `storevirt.ensure_base_image`, as a store host runs
it. Bytes are counted by the server. Until the lab's hypervisors get their own network
namespace the transfer crosses loopback.

Goals (issue 14): the resumed delivery transfers <= 55 % of the image after the cut; a rerun
transfers 0 bytes; a first delivery takes within 10 % of the rate limit's ideal time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import requests
from common import REPO, emit, machine

KEY = "bench-image"


def storevirt(images: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "storevirt_bench", REPO / "salt_states" / "_modules" / "storevirt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__salt__ = {"config.get": lambda key, default=None: (  # type: ignore[attr-defined]
        str(images) if key == "virt:images" else default)}
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="32 MiB image at 64 MiB/s")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rate-mib", type=float, default=100.0, help="rate limit, MiB/s")
    args = parser.parse_args()
    size_mib, rate_mib = (32, 64.0) if args.quick else (args.size_mib, args.rate_mib)
    rate = int(rate_mib * 2**20)
    work = Path(tempfile.mkdtemp(prefix="bench-image-"))
    server = None
    try:
        entry = work / "cache" / KEY
        entry.mkdir(parents=True)
        digest = hashlib.sha256()
        with open(entry / "image.qcow2", "wb") as out:
            for _ in range(size_mib):
                block = os.urandom(2**20)
                digest.update(block)
                out.write(block)
        size = size_mib * 2**20
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "lab.image_server", "--root",
                                   str(work / "cache"), "--port", str(port)], cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                requests.get(f"{base}/_lab/health", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        url, sha = f"{base}/{KEY}/image.qcow2", digest.hexdigest()

        def sent() -> int:
            stats = requests.get(f"{base}/_lab/stats", timeout=10).json()["sent"]
            requests.delete(f"{base}/_lab/stats", timeout=10)
            return int(stats.get(f"/{KEY}/image.qcow2", 0))

        def deliver(hv: Path) -> tuple[dict[str, Any], float, int]:
            started = time.perf_counter()
            try:
                result = storevirt(hv).ensure_base_image(url, KEY, sha, rate_limit=rate)
            except Exception as exc:  # the cut: storevirt says so, the next call resumes
                result = {"error": str(exc)[:200]}
            return result, time.perf_counter() - started, sent()

        first, first_s, first_bytes = deliver(work / "hv1")
        requests.post(f"{base}/_lab/faults", json={"cut_after": size // 2}, timeout=10)
        cut, cut_s, cut_bytes = deliver(work / "hv2")
        resumed, resumed_s, resumed_bytes = deliver(work / "hv2")
        rerun, rerun_s, rerun_bytes = deliver(work / "hv2")
        ideal = size / rate
        emit({
            "bench": "image_delivery", "quick": args.quick, "machine": machine(),
            "size_bytes": size, "rate_limit_bytes_per_s": rate, "ideal_seconds": ideal,
            "first": {"bytes": first_bytes, "seconds": first_s},
            "first_over_ideal": first_s / ideal,
            "cut": {"bytes": cut_bytes, "seconds": cut_s, "error": cut.get("error", "")},
            "resumed": {"bytes": resumed_bytes, "seconds": resumed_s,
                        "resumed_from": resumed.get("resumed_from")},
            "resumed_fraction": resumed_bytes / size,
            "rerun": {"bytes": rerun_bytes, "seconds": rerun_s,
                      "cached": rerun.get("cached")},
            "goals": {"resumed_at_most_55_percent": resumed_bytes <= 0.55 * size,
                      "rerun_zero_bytes": rerun_bytes == 0,
                      "first_within_10_percent_of_ideal": first_s <= 1.10 * ideal,
                      "first_verified": first.get("transferred") == size},
        })
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
