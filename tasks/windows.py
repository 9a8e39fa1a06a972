"""Waiting for a store's maintenance window (store_rollout/disruption.py decides): the flow
run's state says that it waits and why (Prefect shows a state's name and message on the run
page and in the API), then the run goes on by itself when the window opens. The run keeps its
process and its heartbeats meanwhile, so a long wait is never taken for a dead run."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from tasks.run_health import run_logger, say_running

AWAITING_WINDOW: Final = "AwaitingWindow"
# how often a waiting run looks at the clock (it wakes at the window's start, not later)
POLL_SECONDS: Final = 30.0


class NoMaintenanceWindow(RuntimeError):
    """No window long enough for a disruptive step within the calendar's horizon."""


def wait_for_window(store_id: str, window: dict[str, Any],
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait until the window the step asked for opens (its `wait_until`)."""
    until = window.get("wait_until")
    if until is None:
        raise NoMaintenanceWindow(f"store {store_id}: {window['reason']}")
    logger = run_logger(__name__)
    logger.warning("store %s waits: %s", store_id, window["reason"])
    say_running(AWAITING_WINDOW, f"store {store_id}: {window['reason']}")
    while (left := (until - datetime.now(UTC)).total_seconds()) > 0:
        sleep(min(left, POLL_SECONDS))
    logger.info("store %s: its maintenance window opened; going on", store_id)
    say_running("Running", f"store {store_id}: in its maintenance window since {until:%H:%M} UTC")


def run_in_window(store_id: str, run_step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a step until it finds itself in a window (a step outside one changes nothing and
    says until when to wait, in its result's `window`)."""
    while True:
        result = run_step()
        window = result.get("window")
        if window is None or window["go"]:
            return result
        wait_for_window(store_id, window)
