"""Rerun after a failure at step 6: seconds from the rerun's start until step 6 starts
(steps 1-5 judged done by the real systems). Prints one JSON object.

The VM's first reboot never comes back (simulator fault), so the first run fails at step 6.
Each measured rerun then resumes to step 6 and, with the fault still on, fails there again
after one second; the last rerun runs with the fault cleared and must complete.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import requests
from common import cleanup, emit, fresh_inventory, lab_info, machine, median, percentile, prefect_on_lab

from store_rollout import steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reruns", type=int, default=5, help="failing reruns measured")
    args = parser.parse_args()
    reruns = 1 if args.quick else args.reruns
    info = lab_info()
    inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "br", 1)
    sid = ids[0]
    marks: dict[str, float] = {}

    def listen(store: str, step: str, state: str, _s: float) -> None:
        if store == sid and state == "running":
            marks.setdefault(step, time.perf_counter())

    def rerun(**kwargs: float) -> tuple[object, float, float]:
        """(final state, seconds until step 1 starts, seconds until step 6 starts)"""
        marks.clear()
        started = time.perf_counter()
        state = store_rollout(sid, str(inv), return_state=True, **kwargs)
        return (state, marks.get("image", float("nan")) - started,
                marks.get("firstboot", float("nan")) - started)

    fault = f"{info.simulator_url}/faults/reboot"
    to_step6: list[float] = []
    to_step1: list[float] = []
    try:
        with prefect_on_lab(info):
            from flows.rollout import store_rollout

            requests.post(fault, json={"never": True}, timeout=5)
            with steps.listening(listen):
                try:
                    first = store_rollout(sid, str(inv), firstboot_timeout=10, return_state=True)
                    for _ in range(reruns):
                        _state, s1, s6 = rerun(firstboot_timeout=1)
                        to_step1.append(s1)
                        to_step6.append(s6)
                finally:
                    requests.delete(fault, timeout=5)
                final, s1, s6 = rerun(vm_stall_timeout=3)
                to_step1.append(s1)
                to_step6.append(s6)
    finally:
        cleanup(info, ids)
    emit({"benchmark": "resume", "first_run": first.name, "final_rerun": final.name,
          "reruns": len(to_step6),
          "seconds_until_step6_median": median(to_step6),
          "seconds_until_step6_p99": percentile(to_step6, 99),
          "seconds_until_step6": to_step6,
          "seconds_until_step1_median": median(to_step1),
          "final_rerun_step_seconds": final.result()["step_seconds"] if final.is_completed() else {},
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
