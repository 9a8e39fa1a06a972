"""Downtime of a store server per image update (issue 47): stores rolled out on the chain's
version (the lab's v1), then each updated to v2 (store_image_update, one after the other); each
update's `downtime_seconds` (from the shutdown to its minion back on the new system disk: one
reboot) and its whole run. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import cleanup, emit, fresh_inventory, lab_info, machine, median, percentile, prefect_on_lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--stores", type=int, default=3, help="stores updated")
    parser.add_argument("--version", default="v2", help="the version updated to")
    args = parser.parse_args()
    count = 1 if args.quick else args.stores
    info = lab_info()
    inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "bu", count)
    downtime: list[float] = []
    runs: list[float] = []
    outcomes: list[str] = []
    try:
        with prefect_on_lab(info):
            from flows.batch_rollout import batch_rollout
            from flows.image_update import store_image_update

            rolled = batch_rollout(str(inv), tuple(ids), canary=0, wave_size=count,
                                   max_in_flight=count)
            assert all(row["state"] == "Completed" for row in rolled), rolled
            for sid in ids:
                started = time.perf_counter()
                # in the store's window (the lab's chain: all day); going outside it would
                # need a proven approver
                state = store_image_update(sid, str(inv), image_version=args.version,
                                           return_state=True)
                runs.append(time.perf_counter() - started)
                assert state.is_completed(), state.message
                result = state.result()
                outcomes.append(str(result["outcome"]))
                downtime.append(float(result["downtime_seconds"]))
    finally:
        cleanup(info, ids)
    emit({"benchmark": "update_downtime", "stores": count, "to_version": args.version,
          "outcomes": outcomes,
          "downtime_seconds_median": median(downtime),
          "downtime_seconds_p99": percentile(downtime, 99),
          "downtime_seconds": downtime,
          "update_run_seconds_median": median(runs),
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
