"""Reaction to a Salt event: from the event on the master bus to the waiting Prefect task
finishing (p50, p99), against the fixed 5-second polling loop of the original pipeline.
Prints one JSON object."""

from __future__ import annotations

import argparse
import random
import threading
import time

from common import emit, lab_info, machine, percentile, prefect_on_lab
from prefect import flow, task
from prefect.cache_policies import NONE

from tasks.salt import SaltMasterClient

POLL_INTERVAL = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 events, 2 polls")
    parser.add_argument("-n", type=int, default=30, help="events")
    parser.add_argument("--polls", type=int, default=10, help="polling-loop samples")
    args = parser.parse_args()
    n, polls = (5, 2) if args.quick else (args.n, args.polls)
    info = lab_info()
    master = SaltMasterClient(info.salt_master_config)

    @task(cache_policy=NONE)
    def wait_for_tag(tag: str, subscribed: threading.Event) -> float:
        with master.subscribe(tag) as bus:
            subscribed.set()
            event = master.wait_for_event(bus, lambda e: e.tag == tag, timeout=60, what=tag)
        return float(event.data["fired_at"])

    @task(cache_policy=NONE)
    def poll_for(flag: threading.Event, fired: list[float]) -> float:
        while not flag.is_set():  # the hand-written style: check, sleep 5 s, check again
            time.sleep(POLL_INTERVAL)
        return fired[0]

    @flow(name="bench-event-reaction")
    def reaction_flow() -> dict[str, list[float]]:
        event_lat, poll_lat = [], []
        for i in range(n):
            tag = f"bench/reaction/{time.time_ns()}-{i}"
            subscribed = threading.Event()

            def fire(tag: str = tag, subscribed: threading.Event = subscribed) -> None:
                subscribed.wait(30)
                time.sleep(random.uniform(0.05, 0.5))
                master.fire(tag, {"fired_at": time.time()})

            threading.Thread(target=fire, daemon=True).start()
            fired_at = wait_for_tag(tag, subscribed)
            event_lat.append(time.time() - fired_at)
        for _ in range(polls):
            flag, fired = threading.Event(), [0.0]

            def flip(flag: threading.Event = flag, fired: list[float] = fired) -> None:
                time.sleep(random.uniform(0.1, POLL_INTERVAL))
                fired[0] = time.time()
                flag.set()

            threading.Thread(target=flip, daemon=True).start()
            fired_at = poll_for(flag, fired)
            poll_lat.append(time.time() - fired_at)
        return {"event": event_lat, "poll": poll_lat}

    with prefect_on_lab(info):
        lat = reaction_flow()
    ev, po = lat["event"], lat["poll"]
    emit({"benchmark": "event_reaction", "events": n, "polls": polls,
          "event_p50_seconds": percentile(ev, 50), "event_p99_seconds": percentile(ev, 99),
          "poll_p50_seconds": percentile(po, 50), "poll_p99_seconds": percentile(po, 99),
          "poll_over_event_p50_ratio": percentile(po, 50) / percentile(ev, 50),
          "poll_interval_seconds": POLL_INTERVAL, "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
