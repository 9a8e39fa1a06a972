"""What one key deletion costs a fleet: the master rotates its AES key when a minion key is
deleted (`rotate_aes_key`, on by default), and every connected minion must authenticate again.

Rolls out a batch of stores (two minions each: hypervisor and VM), counts the `salt/auth`
events of a quiet half-minute, then rolls one store back (its VM key is deleted) and counts the
minions that authenticate again in the minute after, once the next command is published (a
minion finds out about the new key when it cannot read a publication). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from common import cleanup, emit, fresh_inventory, lab_info, machine, prefect_on_lab


def auth_events(master: Any, seconds: float) -> dict[str, list[float]]:
    """Minion id -> times (s from the start) of its salt/auth requests during `seconds`."""
    seen: dict[str, list[float]] = {}
    started = time.monotonic()
    with master.subscribe("salt/auth") as bus:
        while (left := seconds - (time.monotonic() - started)) > 0:
            raw = bus.get_event(wait=min(1.0, left), full=True)
            if raw and raw["tag"] == "salt/auth":
                minion = (raw.get("data") or {}).get("id", "?")
                seen.setdefault(minion, []).append(round(time.monotonic() - started, 2))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 stores, 20-s windows")
    parser.add_argument("--stores", type=int, default=10)
    parser.add_argument("--window", type=float, default=100.0,
                        help="seconds counted before and after (past the master's 60-s loop)")
    args = parser.parse_args()
    stores, window = (2, 75.0) if args.quick else (args.stores, args.window)
    info = lab_info()
    with prefect_on_lab(info):
        from flows.batch_rollout import batch_rollout
        from flows.store_rollback import store_rollback
        from lab.approvers import approver_code
        from tasks.salt import SaltMasterClient

        master = SaltMasterClient(info.salt_master_config)
        inv, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "kr-", stores)
        try:
            rows = batch_rollout(str(inv), ids, canary=0, wave_size=stores,
                                 max_in_flight=stores, halt_failure_ratio=1.0)
            completed = sum(r["state"] == "Completed" for r in rows)
            connected = sorted(m for m in master.list_keys().get("minions", [])
                               if any(m.startswith(f"store-{sid}-") for sid in ids))
            quiet = auth_events(master, 20 if args.quick else 30)
            rolled_back = time.monotonic()
            import threading

            after: dict[str, dict[str, list[float]]] = {}
            watcher = threading.Thread(target=lambda: after.update(
                events=auth_events(master, window)))
            watcher.start()
            time.sleep(0.5)  # the watcher is subscribed before the key goes
            result = store_rollback(ids[0], str(inv), ignore_windows=True, approver="ana",
                                    code=approver_code(info))
            # the master rotates at its next maintenance loop (loop_interval, 60 s), after the
            # deletion dropped its flag; the minions find out at the next publication they
            # cannot read: the pipeline's next command (here a ping of another store's
            # hypervisor every 5 s) reaches them all
            while watcher.is_alive() and len(ids) > 1:
                with contextlib.suppress(Exception):
                    master.cmd(f"store-{ids[1]}-hv", "test.ping", [], timeout=10)
                time.sleep(5)
            watcher.join()
            deleted_after = time.monotonic() - rolled_back
        finally:
            cleanup(info, ids)
    events = after.get("events", {})
    ours = {m: t for m, t in events.items() if m in connected}
    emit({"benchmark": "key_rotation", "quick": args.quick, "machine": machine(),
          "stores": stores, "completed": completed, "minions_connected": len(connected),
          "key_deleted": result["key"]["key_deleted"],
          "quiet_window_auth_minions": len(quiet),
          "reauthenticated_after_delete": len(ours),
          "reauthenticated_fraction": round(len(ours) / max(1, len(connected)), 3),
          "auth_requests_after_delete": sum(len(t) for t in ours.values()),
          "last_reauth_seconds": max((max(t) for t in ours.values()), default=None),
          "window_seconds": window, "rollback_seconds": round(deleted_after, 2)})


if __name__ == "__main__":
    main()
