"""A wave of N stores through Prefect, on the lab (`store-rollout lab up` first): N light stores
(lab/light_minions: both minions of each store answering a live store's calls, 2 per store, in
one process) signed in to the lab's salt-master, each with its Cobbler record, and one
`batch_rollout` of them all in a single wave with M in flight (defaults 100 and 50). Each store
is a rerun of the real `store-rollout` flow through its seven steps, every step finding its work
done (no install, no VM made, no firstboot waited for; the gate asked, the ERP told): what the
control plane spends on a store's run, not on simulated hardware.

Measures: runs lost or stuck (every store must have one run, ended Completed), the most store
runs in flight at once (the batch's bound held, and reached), the wave's wall time, the CPU
seconds per store of the Prefect server, PostgreSQL, the salt-master and the process running
the flows (bench/cpu.py), the Prefect API's answer times while the wave runs (a reader asking
every half second, as the UI does), and the real reconcile flow's wall time over the region
afterwards. Prints one JSON object and writes bench/region_wave.json.
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from common import REPO, emit, lab_info, machine, percentile, prefect_on_lab
from cpu import per_store, snapshot

from lab.light_minions.answers import HASHES_ENV
from lab.light_minions.region import Master, Swarm
from lab.prefect_access import api_session
from lab.state import VENV_BIN, LabInfo

OUT = REPO / "bench" / "region_wave.json"
RECONCILE_OUT = REPO / "bench" / "region_reconcile.json"
ROOT = REPO / ".lab-scale"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def inventory(path: Path, ids: list[str], stamp: int) -> Path:
    """Live stores' entries: a BMC address that is never called (step 2 finds the host ready)."""
    stores = [{"store_id": sid,
               "hypervisor": {"hostname": f"hv-{sid}.wave.invalid", "power_type": "ipmi",
                              "power_address": "127.0.0.1", "power_port": 20000 + i,
                              "mac": f"5a:55:{stamp >> 8:02x}:{stamp & 0xFF:02x}:"
                                     f"{i >> 8:02x}:{i & 0xFF:02x}"},
               "vm": {"vcpus": 1, "memory_mib": 128, "disk_gib": 2, "network": "none"},
               "erp": {"site_code": f"W-{i}"}} for i, sid in enumerate(ids)]
    path.write_text(yaml.safe_dump({"stores": stores}))
    return path


def cobbler_records(inv: Path, ids: list[str], remove: bool = False) -> None:
    """Each store's record as a finished install leaves it (netboot off, one-time data gone)."""
    from store_rollout.inventory import load_inventory
    from store_rollout.settings import load_settings
    from store_rollout.settings_parts import CobblerSettings, HostSettings, SaltSettings
    from tasks.cobbler.systems import system_spec
    from tasks.cobbler.task import cobbler_client

    settings = load_settings()
    stores = load_inventory(str(inv))
    def one(sid: str) -> None:
        client = cobbler_client(CobblerSettings.of(settings))  # one connection per thread
        store = stores.get(sid)
        if remove:
            client.remove_system(store.cobbler_system)
            return
        spec = system_spec(store, SaltSettings.of(settings), HostSettings.of(settings), "")
        client.upsert_system(dataclasses.replace(spec, autoinstall_meta={}))
        client.disable_netboot(spec.name)

    parent = contextvars.copy_context()  # Prefect's settings (the lab's API) in every thread
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda sid: parent.copy().run(one, sid), ids))


def lab_region(info: LabInfo, root: Path) -> Master:
    """The lab's own salt-master, as the swarm joins it (its keys accepted in its pki_dir)."""
    import salt.config

    opts = salt.config.master_config(info.salt_master_config)
    return Master(root, Path(info.salt_master_config), info.salt_publish_port,
                  info.salt_ret_port, pki_dir=Path(opts["pki_dir"]))


class ApiWatch:
    """While the wave runs: the API's answer time to the UI's kind of read every half second,
    and how many of the wave's store runs are Running (every 2 s)."""

    def __init__(self, info: LabInfo, ids: list[str]) -> None:
        self.url, self.names = info.prefect_api_url, [f"rollout-{sid}" for sid in ids]
        self.latencies: list[float] = []
        self.errors = 0
        self.in_flight_max = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.read, daemon=True),
                        threading.Thread(target=self.count, daemon=True)]

    def read(self) -> None:
        session = api_session(self.url)
        body = {"limit": 25, "sort": "START_TIME_DESC"}
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                session.post(f"{self.url}/flow_runs/filter", json=body,
                             timeout=30).raise_for_status()
                self.latencies.append(time.perf_counter() - started)
            except Exception:  # counted: an error is an answer the UI did not get
                self.errors += 1
            self.stop.wait(0.5)

    def count(self) -> None:
        session = api_session(self.url)
        body = {"flow_runs": {"name": {"any_": self.names}, "state": {"type": {"any_":
                ["RUNNING"]}}}}
        while not self.stop.is_set():
            try:
                running = session.post(f"{self.url}/flow_runs/count", json=body, timeout=30)
                self.in_flight_max = max(self.in_flight_max, int(running.json()))
            except Exception:
                pass
            self.stop.wait(2)

    def __enter__(self) -> ApiWatch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(35)

    def figures(self) -> dict[str, Any]:
        ms = [1000 * s for s in self.latencies]
        return {"reads": len(ms), "errors": self.errors, "p50_ms": percentile(ms, 50),
                "p95_ms": percentile(ms, 95), "max_ms": max(ms, default=float("nan"))}


def run_states(info: LabInfo, ids: list[str], since: float) -> dict[str, list[str]]:
    """{store: [its rollout runs' state types, started after `since`]} (200 runs a page)."""
    session = api_session(info.prefect_api_url)
    found: dict[str, list[str]] = {sid: [] for sid in ids}
    names = [f"rollout-{sid}" for sid in ids]
    for offset in range(0, 10 * len(ids) + 200, 200):
        runs = session.post(f"{info.prefect_api_url}/flow_runs/filter", json={
            "flow_runs": {"name": {"any_": names}}, "limit": 200, "offset": offset},
            timeout=60).json()
        for run in runs:
            created = datetime.fromisoformat(run["created"].replace("Z", "+00:00")).timestamp()
            if created >= since - 5:
                found[run["name"].removeprefix("rollout-")].append(run["state_type"])
        if len(runs) < 200:
            break
    return found


def wave(info: LabInfo, inv: Path, ids: list[str], in_flight: int,
         swarm_pid: int) -> dict[str, Any]:
    from flows.batch_rollout import batch_rollout

    since = time.time()
    # the light minions (the swarm, this process's child) apart from the flow runner
    apart = {"light-minions": swarm_pid}
    cpu_before = snapshot(info, apart=apart)
    with ApiWatch(info, ids) as watch:
        started = time.perf_counter()
        state = batch_rollout(str(inv), tuple(ids), canary=0, wave_size=len(ids),
                              max_in_flight=in_flight, halt_failure_ratio=1.0,
                              rerun_completed=True, return_state=True)
        wall = time.perf_counter() - started
    rows = state.result() if state.is_completed() else []
    runs = run_states(info, ids, since)
    cpu = per_store(cpu_before, snapshot(info, apart=apart), len(ids))
    return {"wall_seconds": wall, "batch_state": str(state.name),
            "completed": sum(r["state"] == "Completed" for r in rows),
            "lost": sorted(sid for sid, states in runs.items() if not states),
            "stuck": sorted(sid for sid, states in runs.items()
                            if any(s not in TERMINAL for s in states)),
            "not_completed": sorted(sid for sid, states in runs.items()
                                    if states and "COMPLETED" not in states),
            "in_flight_max": watch.in_flight_max, "api": watch.figures(),
            **cpu, "light_minions_per_store": cpu["per_store_cpu_seconds"]["light-minions"]}


def reconcile(inv: Path, stores: int) -> dict[str, Any]:
    """The real reconcile flow over the region's light stores after the wave: its wall time
    (Salt's reads, then each store's Cobbler record, ERP notices and last run) and verdicts."""
    from flows.reconcile import store_reconcile

    started = time.perf_counter()
    found = store_reconcile(str(inv))
    wall = time.perf_counter() - started
    codes = Counter(code for status in found["stores"].values()
                    for code in (m["code"] for m in status["mismatches"]))
    return {"seconds": wall, "stores": stores, "seconds_per_store": wall / stores,
            "counts": found["counts"], "mismatch_codes": dict(codes)}


def run_wave(info: LabInfo, inv: Path, ids: list[str], in_flight: int, swarm_pid: int
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One store alone (the image cached), then the others in one wave, then reconcile."""
    from flows.rollout import store_rollout

    warm_started = time.perf_counter()
    warm = store_rollout(ids[0], str(inv), return_state=True)
    alone = {"state": str(warm.name), "seconds": time.perf_counter() - warm_started}
    result = wave(info, inv, ids[1:], in_flight, swarm_pid)
    result["reconcile"] = reconcile(inv, len(ids))
    return result, alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="4 stores, 2 in flight")
    parser.add_argument("--reconcile-only", action="store_true",
                        help="no wave: the reconcile flow over N+1 light stores (e.g. 1000)")
    args = parser.parse_args()
    stores, in_flight = (4, 2) if args.quick else (args.stores, args.in_flight)
    info = lab_info()
    stamp = int(time.time() * 10) % 0xFFFF
    ids = [f"w{stamp:04x}-{i:03d}" for i in range(stores + 1)]  # the first one warms up
    root = ROOT / f"wave-{stamp:04x}"
    root.mkdir(parents=True, exist_ok=True)
    inv = inventory(root / "inventory.yaml", ids, stamp)
    master = lab_region(info, root)
    with prefect_on_lab(info):
        from store_rollout.settings import load_settings
        from tasks.salt import SaltMasterClient

        salt = SaltMasterClient(info.salt_master_config)
        (root / "hashes.json").write_text(json.dumps(salt.extension_hashes()[1]))
        os.environ[HASHES_ENV] = str(root / "hashes.json")
        # the version the chain expects, so reconcile finds the stores on it (a live region)
        os.environ["LIGHT_MINION_IMAGE_VERSION"] = load_settings().image_version or "1.0.0"
        # keys from the pool bench_region_scale keeps (generated once, not timed)
        swarm = Swarm(master, [f"store-{sid}-{kind}" for sid in ids for kind in ("hv", "vm")],
                      keys_dir=ROOT / "keys")
        try:
            cobbler_records(inv, ids)
            signin = swarm.start()
            if args.reconcile_only:  # a region's reconcile alone, at the region's size
                result, alone = {"reconcile": reconcile(inv, len(ids))}, dict[str, Any]()
            else:
                assert swarm.proc is not None
                result, alone = run_wave(info, inv, ids, in_flight, swarm.proc.pid)
            out = {"benchmark": "region_wave", "stores": stores, "max_in_flight": in_flight,
                   "signin_seconds": signin, "one_store_alone": alone, "wave": result,
                   "machine": machine(), "quick": args.quick}
            if not args.quick:  # kept before the clean-up, whatever becomes of it
                (RECONCILE_OUT if args.reconcile_only else OUT).write_text(
                    json.dumps(out, indent=1, default=str) + "\n")
        finally:
            swarm.stop()
            # one deletion for them all: one by one the master deleted about one a second
            subprocess.run([str(VENV_BIN / "salt-key"), "-c",
                            str(Path(info.salt_master_config).parent), "-y", "-d",
                            f"store-w{stamp:04x}-*"], check=False, capture_output=True,
                           timeout=600)
            cobbler_records(inv, ids, remove=True)
            shutil.rmtree(root, ignore_errors=True)  # the swarm's keys and pki dirs
    emit(out)


if __name__ == "__main__":
    main()
