"""Wall time of batches of 1 and 10 stores (all ten in flight) and the ratio to one store.
Also the acceptance check that the lab holds the batch with no lost or stuck run, and the CPU
seconds per store of each control-plane process (Prefect server, PostgreSQL, salt-master,
cobblerd, the process running the flows) apart from the simulated hardware (minions, QEMU,
simulator): the control plane's cost per store and the capacity it implies.
Prints one JSON object."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import cleanup, emit, fresh_inventory, lab_info, machine, prefect_on_lab
from cpu import per_store, snapshot

from lab.prefect_access import api_session

# lab-sized: a hypervisor the lab lost fails the store after 10 min instead of an hour
STORE_PARAMS = {"hypervisor_timeout": 600.0, "hypervisor_stall_timeout": 120.0}


def runs_not_finished(api_url: str, store_ids: list[str]) -> int:
    """Store flow runs Prefect still sees as scheduled, pending or running (stuck or lost)."""
    from prefect.client.schemas.objects import TERMINAL_STATES, StateType

    runs = api_session(api_url).post(f"{api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{sid}" for sid in store_ids]}},
        "limit": 200}, timeout=30).json()
    return sum(StateType(run["state_type"]) not in TERMINAL_STATES for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="batches of 1 and 2")
    parser.add_argument("--sizes", default="1,10")
    parser.add_argument("--max-in-flight", type=int, default=10)
    args = parser.parse_args()
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    info = lab_info()
    results = {}
    with prefect_on_lab(info):
        from flows.batch_rollout import batch_rollout

        for size in sizes:
            inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", f"bb{size}-", size)
            try:
                cpu_before = snapshot(info)
                started = time.perf_counter()
                state = batch_rollout(str(inv), ids, canary=0, wave_size=size,
                                      max_in_flight=args.max_in_flight, halt_failure_ratio=1.0,
                                      store_params=STORE_PARAMS,
                                      return_state=True)
                wall = time.perf_counter() - started
                cpu = per_store(cpu_before, snapshot(info), size)
                rows = state.result() if state.is_completed() else []
            finally:
                cleanup(info, ids)
            results[size] = {"wall_seconds": wall,
                             "completed": sum(r["state"] == "Completed" for r in rows),
                             "failed_or_missing": size - sum(r["state"] == "Completed" for r in rows),
                             "runs_not_finished": runs_not_finished(info.prefect_api_url, ids),
                             **cpu}
    single = results[sizes[0]]["wall_seconds"]
    largest = results[sizes[-1]]
    control = largest["control_plane_per_store"]
    emit({"benchmark": "batch", "max_in_flight": args.max_in_flight,
          "batches": {str(k): v for k, v in results.items()},
          "ratio_to_single": {str(k): v["wall_seconds"] / single for k, v in results.items()},
          "per_store_seconds": {str(k): v["wall_seconds"] / k for k, v in results.items()},
          # if only the control plane used the CPU: stores per hour for each core it had
          "capacity_stores_per_hour_per_control_plane_core":
              round(3600 / control, 1) if control else None,
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
