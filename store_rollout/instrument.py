"""Where a rollout's time goes: seconds spent inside calls to the outside systems.

Clients wrap their calls in `external("<system>")`; a benchmark opens `measuring()` around a
rollout and reads the totals. A ContextVar holding a shared dict follows the flow into its task
runs (Prefect copies the context), and costs nothing when nobody measures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_totals: ContextVar[dict[str, float] | None] = ContextVar("store_rollout_external", default=None)

SYSTEMS = ("salt", "cobbler", "libvirt", "erp", "kiwi", "hardware_wait")


@contextmanager
def external(system: str) -> Iterator[None]:
    totals = _totals.get()
    if totals is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        totals[system] += time.perf_counter() - started


def add(system: str, seconds: float) -> None:
    totals = _totals.get()
    if totals is not None:
        totals[system] += seconds


@contextmanager
def measuring() -> Iterator[dict[str, float]]:
    totals: dict[str, float] = defaultdict(float)
    token = _totals.set(totals)
    try:
        yield totals
    finally:
        _totals.reset(token)
