"""Reading the master's event bus: events as `SaltEvent`, the next one that matches.

The bus and the clock are parameters, so a watcher's wait runs over a scripted stream and a
fake clock in a unit test as it runs over Salt's bus in a rollout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from store_rollout.instrument import external
from tasks.salt.errors import SaltEventTimeout


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


class EventBus(Protocol):
    """What is used of Salt's `MasterEvent`: a raw event ({tag, data}) or None after `wait`."""

    def get_event(self, wait: float, full: bool) -> dict[str, Any] | None: ...


@dataclass
class SaltEvent:
    tag: str
    data: dict[str, Any]
    received: float = field(default_factory=time.time)

    @property
    def minion(self) -> str | None:
        return self.data.get("id")

    @property
    def payload(self) -> dict[str, Any]:
        """Data of a minion-fired event is nested one level (notes/salt.md §5)."""
        inner = self.data.get("data")
        return inner if isinstance(inner, dict) else self.data


def next_event(bus: EventBus, match: Callable[[SaltEvent], bool], timeout: float, what: str,
               seen: Callable[[SaltEvent], None] | None = None,
               clock: Clock = SYSTEM_CLOCK) -> SaltEvent:
    """Next event on an open bus that `match`es; `seen` gets every event on the way."""
    deadline = clock.monotonic() + timeout
    while clock.monotonic() < deadline:
        with external("hardware_wait"):
            raw = bus.get_event(wait=min(1.0, max(0.05, deadline - clock.monotonic())), full=True)
        if not raw:
            continue
        event = SaltEvent(raw["tag"], raw.get("data") or {})
        if seen:
            seen(event)
        if match(event):
            return event
    raise SaltEventTimeout(f"no event {what} within {timeout:.0f}s", operation=what,
                           timeout=timeout)
