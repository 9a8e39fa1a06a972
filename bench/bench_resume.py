"""Rerun after a failure at step 6: seconds from the rerun's start until step 6 starts
(steps 1-5 judged done by the real systems). Prints one JSON object."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import requests
from common import cleanup, emit, fresh_inventory, lab_info, machine, prefect_on_lab

from store_rollout import steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    info = lab_info()
    inv, ids = fresh_inventory(Path(tempfile.mkdtemp()) / "inv.yaml", "br", 1)
    sid = ids[0]
    marks: dict[str, float] = {}

    def listen(store: str, step: str, state: str, _s: float) -> None:
        if store == sid and state == "running":
            marks.setdefault(step, time.perf_counter())

    try:
        with prefect_on_lab(info):
            from flows.store_rollout import store_rollout

            requests.post(f"{info.simulator_url}/faults/reboot", json={"never": True}, timeout=5)
            try:
                first = store_rollout(sid, str(inv), firstboot_timeout=10, return_state=True)
            finally:
                requests.delete(f"{info.simulator_url}/faults/reboot", timeout=5)
            steps.add_listener(listen)
            started = time.perf_counter()
            second = store_rollout(sid, str(inv), vm_stall_timeout=3, return_state=True)
            total = time.perf_counter() - started
            steps.remove_listener(listen)
    finally:
        cleanup(info, ids)
    emit({"benchmark": "resume", "first_run": first.name, "rerun": second.name,
          "seconds_until_step6": marks.get("firstboot", float("nan")) - started,
          "rerun_seconds": total,
          "rerun_step_seconds": second.result()["step_seconds"] if second.is_completed() else {},
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
