"""How long `plan` of one store and `reconcile` of a fleet take, and how many Salt jobs they cost.

Rolls out a batch of stores, then times the store-plan flow for one store (with and without the
hypervisor's highstate in test=True) and the store-reconcile flow for the whole batch, each
several times (medians), counting the Salt jobs each publishes (`salt/job/*/new` on the master's
bus): one batched job per kind, whatever the number of stores. Also times the CLI's
`store-rollout plan` once (a process start included). Goals (issue 18): plan of one store
<= 3 s, reconcile of 25 stores <= 15 s. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import cleanup, emit, fresh_inventory, lab_info, machine, median, prefect_on_lab

from lab.prefect_access import PrefectAccess
from lab.state import VENV_BIN, LabPaths


def timed_with_jobs(master: Any, fn: Callable[[], Any]) -> tuple[float, Counter[str], Any]:
    """Seconds `fn` took and the Salt functions of the jobs published meanwhile."""
    jobs: Counter[str] = Counter()
    stop = threading.Event()
    listening = threading.Event()

    def listen() -> None:
        with master.subscribe("salt/job/") as bus:
            listening.set()
            while not stop.is_set():
                raw = bus.get_event(wait=0.2, full=True)
                if raw and raw["tag"].endswith("/new"):
                    jobs[str((raw.get("data") or {}).get("fun"))] += 1

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    listening.wait(10)
    started = time.monotonic()
    result = fn()
    seconds = time.monotonic() - started
    time.sleep(0.5)  # the last publication's event
    stop.set()
    thread.join(5)
    return seconds, jobs, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 stores, 2 repetitions")
    parser.add_argument("--stores", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    stores, repeat = (2, 2) if args.quick else (args.stores, args.repeat)
    info = lab_info()
    with prefect_on_lab(info):
        from flows.batch_rollout import batch_rollout
        from flows.plan import store_plan
        from flows.reconcile import store_reconcile
        from tasks.salt import SaltMasterClient

        master = SaltMasterClient(info.salt_master_config)
        inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "pr-", stores)
        try:
            started = time.monotonic()
            rows = batch_rollout(str(inv), ids, canary=0, wave_size=stores,
                                 max_in_flight=min(stores, 10), halt_failure_ratio=1.0)
            rollout_seconds = time.monotonic() - started
            completed = sum(r["state"] == "Completed" for r in rows)
            plans: dict[str, list[float]] = {"with_highstate_test": [], "without": []}
            plan_jobs: dict[str, Counter[str]] = {}
            todo: list[str] = []
            for _ in range(repeat):
                for key, test in (("with_highstate_test", True), ("without", False)):
                    seconds, jobs, plan = timed_with_jobs(
                        master, lambda test=test: store_plan([ids[0]], str(inv), test))
                    plans[key].append(seconds)
                    plan_jobs[key] = jobs
                    todo = plan[ids[0]]["todo"]
            reconciles: list[float] = []
            reconcile_jobs: Counter[str] = Counter()
            counts: dict[str, int] = {}
            for _ in range(repeat):
                seconds, reconcile_jobs, result = timed_with_jobs(
                    master, lambda: store_reconcile(str(inv)))
                reconciles.append(seconds)
                counts = result["counts"]
            env = {**os.environ,
                   "STORE_ROLLOUT_SETTINGS_FILE": str(LabPaths(Path(info.state_dir)).settings_file),
                   **PrefectAccess.of(info).env()}
            cli_started = time.monotonic()
            cli = subprocess.run([str(VENV_BIN / "store-rollout"), "plan", ids[0], "--inventory",
                                  str(inv), "--json"], env=env, capture_output=True, text=True,
                                 timeout=300, check=False)
            cli_seconds = time.monotonic() - cli_started
        finally:
            cleanup(info, ids)
    plan_median = median(plans["with_highstate_test"])
    reconcile_median = median(reconciles)
    emit({
        "benchmark": "plan_reconcile", "quick": args.quick, "machine": machine(),
        "stores": stores, "completed": completed, "rollout_seconds": rollout_seconds,
        "repeat": repeat,
        "plan_seconds_median": plan_median,
        "plan_seconds": plans["with_highstate_test"],
        "plan_without_highstate_test_seconds_median": median(plans["without"]),
        "plan_salt_jobs": dict(plan_jobs.get("with_highstate_test", {})),
        "plan_todo_after_rollout": todo,
        "plan_cli_seconds": cli_seconds, "plan_cli_rc": cli.returncode,
        "reconcile_seconds_median": reconcile_median,
        "reconcile_seconds": reconciles,
        "reconcile_salt_jobs": dict(reconcile_jobs),
        "reconcile_counts": counts,
        "goals": {"plan_at_most_3_s": plan_median <= 3.0,
                  "reconcile_at_most_15_s": reconcile_median <= 15.0},
    })


if __name__ == "__main__":
    main()
