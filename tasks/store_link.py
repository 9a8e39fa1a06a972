"""Offline-first runs (issue 49): after step 5 a store whose minions all stop answering (its WAN
link is down, or its power) is waited for, not failed.

The run says so (its state `StoreLinkDown`, message "store <id> link down since <UTC>", and the
log), the master pings the store's minions (test.ping, bounded timeouts) until one answers, then
the step goes on where it was: a wait (step 6's) reads again what it may have missed, a call
(the go-live checks, a seed's retirement: read-only or idempotent calls only) is asked again.
Past `store_link_wait_seconds` the run fails with one line naming the store, since when it has
been silent and the setting. Silence is never taken for absence: nothing is reset, reinstalled
or deleted because a store is silent (a VM alone silent while its hypervisor answers is not a
link down: step 6's own stall logic judges it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol, TypeVar

from store_rollout.inventory import Store
from tasks.run_health import run_logger, say_running
from tasks.salt.errors import SaltError, SaltMinionNoResponse
from tasks.salt.probes import PROBE_GATHER_TIMEOUT, PROBE_TIMEOUT

LINK_DOWN: Final = "StoreLinkDown"
# seconds between two rounds of pings of a silent store (a round: each minion once, 7 s at most)
PING_SECONDS: Final = 10.0
SETTING: Final = "store_link_wait_seconds"
T = TypeVar("T")


class StoreCalls(Protocol):
    """What a step calls on a store's minions through the master (SaltMasterClient.cmd)."""

    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any: ...


class StoreLinkLost(Exception):
    """A store stayed silent past `store_link_wait_seconds` (not retried: the wait was it)."""


def utc(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def link_down_message(store_id: str, since: datetime) -> str:
    """What the run's state and log say while it waits."""
    return f"store {store_id} link down since {utc(since)}"


def past_bound(silent_seconds: float, bound: float) -> bool:
    """Whether a silence of `silent_seconds` is past the wait's bound (the run then fails)."""
    return silent_seconds >= bound


def silence_failure(store_id: str, minions: list[str], since: datetime, bound: float) -> str:
    """The one line a run fails with when its store stayed silent past the bound."""
    return (f"store {store_id}: its minions {', '.join(minions)} have been silent since "
            f"{utc(since)}, longer than {SETTING} ({bound:.0f} s): the store's link is still down "
            f"(or its power); raise STORE_ROLLOUT_{SETTING.upper()} to wait longer, then run the "
            "store again: it resumes where it stopped, nothing was undone")


class StoreLink:
    """One store's link, as a step after step 5 rides out its outages."""

    def __init__(self, master: StoreCalls, store: Store, bound: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], None] = time.sleep,
                 say: Callable[[str, str], None] = say_running,
                 interval: float = PING_SECONDS) -> None:
        self.master, self.store, self.bound = master, store, bound
        self.clock, self.wall, self.sleep, self.say = clock, wall, sleep, say
        self.interval = interval
        self.minions = [store.hypervisor_minion_id, store.vm_minion_id]
        self.outages: list[dict[str, Any]] = []

    def answers(self) -> bool:
        """Whether any of the store's minions answers a ping now (its link is up)."""
        for minion in self.minions:
            try:
                if self.master.cmd(minion, "test.ping", timeout=PROBE_TIMEOUT,
                                   gather_job_timeout=PROBE_GATHER_TIMEOUT):
                    return True
            except SaltError:
                continue
        return False

    def hold(self, silent_for: float = 0.0) -> float:
        """Nothing (0) when the store answers; else the run waits, saying so, until it answers
        (the seconds waited) or fails past the bound. `silent_for`: how long the caller has
        heard nothing from the store already (counted in the bound)."""
        start, since = self.clock(), self.wall() - timedelta(seconds=silent_for)
        if self.answers():
            return 0.0
        message = link_down_message(self.store.store_id, since)
        run_logger(__name__).warning("%s; pinging it every %.0f s, for up to %.0f s (%s)",
                                     message, self.interval, self.bound, SETTING)
        self.say(LINK_DOWN, message)
        while not self.answers():
            # the bound is the run's, over all its outages: a line that answers once per bound
            # and drops again must not keep a run waiting for ever
            if past_bound(self.waited_before() + silent_for + self.clock() - start, self.bound):
                raise StoreLinkLost(silence_failure(self.store.store_id, self.minions, since,
                                                    self.bound))
            self.sleep(self.interval)
        waited = self.clock() - start
        self.outages.append({"since": utc(since), "seconds": round(silent_for + waited, 1)})
        back = f"store {self.store.store_id}: link back at {utc(self.wall())}, " \
               f"down since {utc(since)}"
        run_logger(__name__).warning("%s; the step goes on", back)
        self.say("Running", back)
        return waited

    def waited_before(self) -> float:
        """Seconds of the outages this run has ridden out already."""
        return float(sum(outage["seconds"] for outage in self.outages))

    def call(self, ask: Callable[[], T]) -> T:
        """`ask()` (a read-only or idempotent call to the store), asked again once the store's
        link is back when its minion did not answer because the link was down."""
        while True:
            try:
                return ask()
            except SaltMinionNoResponse:
                if not self.hold():
                    raise  # the store answers: that minion alone is silent, not the link


class LinkedCalls:
    """The master's `cmd` for a step's calls to a store, each riding out the store's outages."""

    def __init__(self, master: StoreCalls, link: StoreLink) -> None:
        self.master, self.link = master, link

    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any:
        return self.link.call(lambda: self.master.cmd(
            minion_id, fun, arg, kwarg=kwarg, timeout=timeout,
            gather_job_timeout=gather_job_timeout))
