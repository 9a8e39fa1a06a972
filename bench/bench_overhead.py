"""Per store: end-to-end wall time minus the time inside Salt, Cobbler, libvirt, ERP and KIWI
calls and waiting for hardware events = what the pipeline itself adds. Prints one JSON object.

The wall time ends when the flow call returns, the flow run as `store-rollout rollout` runs it
(app/runner.py's Prefect settings). Prefect's engine returns after the run is Completed (the UI,
the API and a waiting batch already see it) and after its heartbeat thread stopped: Prefect's
own, sleeping in 1-s steps, held the return 0-1 s; the commands turn it off, as the flows send
their own (tasks/run_health.py). `exit_delay` is that part, and `overhead_until_completed` the
overhead without it."""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from common import cleanup, emit, fresh_inventory, lab_info, machine, median, prefect_on_lab

from store_rollout.instrument import SYSTEMS, measuring


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one store")
    parser.add_argument("--stores", type=int, default=3, help="stores, rolled out one by one")
    args = parser.parse_args()
    count = 1 if args.quick else args.stores
    info = lab_info()
    inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "bo", count)
    rows = []
    try:
        with prefect_on_lab(info):
            from flows.rollout import store_rollout

            for sid in ids:
                with measuring() as spent:
                    started, started_at = time.perf_counter(), datetime.now(UTC)
                    state = store_rollout(sid, str(inv), return_state=True)
                    wall = time.perf_counter() - started
                external = sum(spent.values())
                # the Completed state's own time, set by the engine as it proposed that state
                until_completed = (state.timestamp - started_at).total_seconds()
                rows.append({"store": sid, "completed": state.is_completed(), "wall": wall,
                             "external": external, "overhead": wall - external,
                             "exit_delay": wall - until_completed,
                             "overhead_until_completed": until_completed - external,
                             **{f"in_{k}": spent.get(k, 0.0) for k in SYSTEMS}})
    finally:
        cleanup(info, ids)
    emit({
        "benchmark": "overhead", "stores": count, "completed": sum(r["completed"] for r in rows),
        "wall_seconds_median": median([r["wall"] for r in rows]),
        "external_seconds_median": median([r["external"] for r in rows]),
        "overhead_seconds_median": median([r["overhead"] for r in rows]),
        "exit_delay_seconds_median": median([r["exit_delay"] for r in rows]),
        "overhead_until_completed_seconds_median": median(
            [r["overhead_until_completed"] for r in rows]),
        "overhead_ratio_median": median([r["overhead"] / r["wall"] for r in rows]),
        "external_by_system_median": {k: median([r[f"in_{k}"] for r in rows]) for k in SYSTEMS},
        "machine": machine(), "quick": args.quick,
    })


if __name__ == "__main__":
    main()
