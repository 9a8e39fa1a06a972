"""A burst of rollouts through the Prefect REST API: `create_flow_run` on the store-rollout
deployment for every store of a generated inventory, as a script or an ERP would, all at once.

Counts what became of each run (none lost: every run ends Completed, or Failed/Crashed with a
reason), checks that no fleet slot is left taken (cobbler-sync, each store's own limit), and
records the runtime, the API's answer times for the burst and the CPU of the Prefect server and
its PostgreSQL. A store's simulated hardware is removed as soon as its run ended. The lab's
worker runs at most its `--limit` flow runs at once; the rest wait in the work queue. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import (
    cleanup,
    cleanup_store,
    emit,
    fresh_inventory,
    lab_info,
    machine,
    median,
    percentile,
)
from cpu import snapshot

from lab.prefect_access import api_session

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# lab-sized: a hypervisor the lab lost fails the store after 10 min instead of an hour
STORE_PARAMS = {"hypervisor_timeout": 600.0, "hypervisor_stall_timeout": 120.0}


def read_runs(api: str, run_ids: list[str]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for start in range(0, len(run_ids), 200):
        runs += api_session(api).post(f"{api}/flow_runs/filter", json={
            "flow_runs": {"id": {"any_": run_ids[start:start + 200]}}, "limit": 200},
            timeout=30).json()
    return runs


def slots_taken(api: str, names: list[str]) -> dict[str, int]:
    """Active slots of these global concurrency limits that are still taken."""
    taken = {}
    for name in names:
        resp = api_session(api).get(f"{api}/v2/concurrency_limits/{name}", timeout=10)
        if resp.status_code == 200 and resp.json()["active_slots"]:
            taken[name] = resp.json()["active_slots"]
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 stores")
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    stores = 5 if args.quick else args.stores
    info = lab_info()
    api = info.prefect_api_url
    inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "burst-", stores)
    deployment = api_session(api).get(f"{api}/deployments/name/store-rollout/store-rollout",
                              timeout=10).json()
    cpu_before = snapshot(info)
    started = time.perf_counter()
    answer_seconds, run_ids = [], []
    try:
        for sid in ids:
            asked = time.perf_counter()
            resp = api_session(api).post(f"{api}/deployments/{deployment['id']}/create_flow_run", json={
                "parameters": {"store_id": sid, "inventory": str(inv), **STORE_PARAMS}},
                timeout=30)
            resp.raise_for_status()
            answer_seconds.append(time.perf_counter() - asked)
            run_ids.append(resp.json()["id"])
        burst_seconds = time.perf_counter() - started
        store_of = dict(zip(run_ids, ids, strict=True))
        runs = read_runs(api, run_ids)
        most_running = 0
        # a finished store's simulated hardware (two minions, a QEMU) is removed at once, as a
        # real store's would be elsewhere: 2 cores cannot host 100 stores' hardware at a time
        with ThreadPoolExecutor(max_workers=3) as removal:
            removed: set[str] = set()
            while (time.perf_counter() - started < args.timeout
                   and any(run["state_type"] not in TERMINAL for run in runs)):
                time.sleep(5)
                runs = read_runs(api, run_ids)
                most_running = max(most_running,
                                   sum(run["state_type"] == "RUNNING" for run in runs))
                for run in runs:
                    if run["state_type"] in TERMINAL and run["id"] not in removed:
                        removed.add(run["id"])
                        removal.submit(cleanup_store, info, store_of[run["id"]])
        wall = time.perf_counter() - started
        cpu_after = snapshot(info)
        # leases are released as each run ends; a slot still taken here is an orphan
        left_taken = slots_taken(api, ["cobbler-sync", *[f"store-{sid}" for sid in ids]])
    finally:
        cleanup(info, ids)
    states = Counter(run["state_type"] for run in runs)
    unexplained = [run["name"] for run in runs if run["state_type"] in TERMINAL - {"COMPLETED"}
                   and not (run.get("state") or {}).get("message")]
    server = sum(max(0.0, cpu_after.get(n, 0.0) - cpu_before.get(n, 0.0))
                 for n in ("prefect-server", "postgres"))
    emit({"benchmark": "api_burst", "stores": stores,
          "runs_created": len(run_ids),
          "runs_found": len(runs),
          "lost": len(ids) - len(runs),
          "states": dict(states),
          "not_finished": sum(run["state_type"] not in TERMINAL for run in runs),
          "failed_without_reason": unexplained,
          "failure_reasons": sorted({str((run.get("state") or {}).get("message"))[:200]
                                     for run in runs if run["state_type"] != "COMPLETED"}),
          "slots_left_taken": left_taken,
          "burst_seconds": burst_seconds,
          "create_flow_run_seconds": {"p50": median(answer_seconds),
                                      "p99": percentile(answer_seconds, 99)},
          "wall_seconds": wall,
          "stores_per_hour": 3600 * states.get("COMPLETED", 0) / wall,
          "server_cpu_seconds": round(server, 1),
          "server_cpu_seconds_per_run": round(server / stores, 3),
          "most_running_at_once": most_running,
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
