"""Base image delivery to a hypervisor, rate-limited: first delivery, a delivery cut at ~50 %
and resumed, and a rerun. Prints one JSON object.

The lab's image server (`lab.image_server`, its own process) serves a `--size-mib` image;
the hypervisor side is the project's own `storevirt.ensure_base_image` (its utils module
salt_states/_utils/store_image_download.py), as a store host runs it, in a process of its own
on a store network of the lab's (`lab.store_network`: its own network namespace, a veth pair to
the gateway's bridge, the server reached at the gateway's address as a store host reaches it).
Bytes are counted by the server. Needs root (namespaces).

Goals (issue 14): the resumed delivery transfers <= 55 % of the image after the cut; a rerun
transfers 0 bytes; a first delivery takes within 10 % of the rate limit's ideal time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
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

from lab.store_network import StoreNetwork, machine_address

KEY = "bench-image"


def image_download() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "store_image_download_bench", REPO / "salt_states" / "_utils" / "store_image_download.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deliveries(base: str, size: int, sha: str, rate: int, work: Path) -> dict[str, Any]:
    """The hypervisor's side: runs on the store network (`--on-store-network`)."""
    url = f"{base}/{KEY}/image.qcow2"

    def sent() -> int:
        stats = requests.get(f"{base}/_lab/stats", timeout=10).json()["sent"]
        requests.delete(f"{base}/_lab/stats", timeout=10)
        return int(stats.get(f"/{KEY}/image.qcow2", 0))

    def deliver(hv: Path) -> tuple[dict[str, Any], float, int]:
        started = time.perf_counter()
        try:
            result = image_download().ensure_base_image(str(hv), url, KEY, sha, rate_limit=rate)
        except Exception as exc:  # the cut: storevirt says so, the next call resumes
            result = {"error": str(exc)[:200]}
        return result, time.perf_counter() - started, sent()

    first, first_s, first_bytes = deliver(work / "hv1")
    requests.post(f"{base}/_lab/faults", json={"cut_after": size // 2}, timeout=10)
    cut, cut_s, cut_bytes = deliver(work / "hv2")
    resumed, resumed_s, resumed_bytes = deliver(work / "hv2")
    rerun, rerun_s, rerun_bytes = deliver(work / "hv2")
    ideal = size / rate
    return {
        "url": url, "ideal_seconds": ideal,
        "first": {"bytes": first_bytes, "seconds": first_s},
        "first_over_ideal": first_s / ideal,
        "cut": {"bytes": cut_bytes, "seconds": cut_s, "error": cut.get("error", "")},
        "resumed": {"bytes": resumed_bytes, "seconds": resumed_s,
                    "resumed_from": resumed.get("resumed_from")},
        "resumed_fraction": resumed_bytes / size,
        "rerun": {"bytes": rerun_bytes, "seconds": rerun_s, "cached": rerun.get("cached")},
        "goals": {"resumed_at_most_55_percent": resumed_bytes <= 0.55 * size,
                  "rerun_zero_bytes": rerun_bytes == 0,
                  "first_within_10_percent_of_ideal": first_s <= 1.10 * ideal,
                  "first_verified": first.get("transferred") == size},
    }


def wait_for(check: Any, what: str) -> None:
    for _ in range(200):
        if check():
            return
        time.sleep(0.1)
    raise SystemExit(f"bench: {what} did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="32 MiB image at 64 MiB/s")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rate-mib", type=float, default=100.0, help="rate limit, MiB/s")
    parser.add_argument("--on-store-network", nargs=4, metavar=("BASE", "SHA", "RATE", "WORK"),
                        help=argparse.SUPPRESS)  # the hypervisor side, started by main
    args = parser.parse_args()
    size_mib, rate_mib = (32, 64.0) if args.quick else (args.size_mib, args.rate_mib)
    size = size_mib * 2**20
    if args.on_store_network:
        base, sha, rate_text, work_dir = args.on_store_network
        print(json.dumps(deliveries(base, size, sha, int(rate_text), Path(work_dir))),
              file=sys.__stdout__, flush=True)
        return
    rate = int(rate_mib * 2**20)
    work = Path(tempfile.mkdtemp(prefix="bench-image-"))
    started: list[subprocess.Popen[bytes]] = []
    try:
        entry = work / "cache" / KEY
        entry.mkdir(parents=True)
        digest = hashlib.sha256()
        with open(entry / "image.qcow2", "wb") as out:
            for _ in range(size_mib):
                block = os.urandom(2**20)
                digest.update(block)
                out.write(block)
        port = free_port()
        started.append(subprocess.Popen([sys.executable, "-m", "lab.image_server", "--root",
                                         str(work / "cache"), "--port", str(port)], cwd=REPO))
        state_file = work / "store-network.json"
        started.append(subprocess.Popen([sys.executable, "-m", "lab.store_network",
                                         "--state-file", str(state_file), f"--forward={port}"],
                                        cwd=REPO))
        wait_for(state_file.exists, "the store network")
        network = StoreNetwork.load(state_file)
        hypervisor = subprocess.run(
            ["unshare", "--net", "--", sys.executable, str(REPO / "lab" / "host_namespace.py"),
             *network.join_args("bench-hv", machine_address(0)), "--",
             sys.executable, __file__, *(["--quick"] if args.quick else
                                         ["--size-mib", str(size_mib)]),
             "--on-store-network", network.url(port), digest.hexdigest(), str(rate), str(work)],
            cwd=REPO, capture_output=True, text=True, check=False, timeout=3600)
        if hypervisor.returncode != 0 or not hypervisor.stdout.strip():
            raise SystemExit(f"bench: the hypervisor side failed: {hypervisor.stderr[-3000:]}")
        emit({"bench": "image_delivery", "quick": args.quick, "machine": machine(),
              "size_bytes": size, "rate_limit_bytes_per_s": rate,
              "network": f"store network {network.gateway}/{network.prefix}, veth",
              **json.loads(hypervisor.stdout.strip().splitlines()[-1])})
    finally:
        for process in reversed(started):
            process.terminate()
            process.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
