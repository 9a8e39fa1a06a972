"""Waiting for a store's maintenance window (store_rollout/disruption.py decides): the flow
run's state says that it waits and why (Prefect shows a state's name and message on the run
page and in the API), then the run goes on by itself when the window opens. The run keeps its
process and its heartbeats meanwhile, so a long wait is never taken for a dead run."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from store_rollout import disruption, guard
from store_rollout.contracts import STEP_CREATE_VM, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.guard import Action, Consent
from store_rollout.inventory import Store
from store_rollout.settings_parts import CalendarSettings
from tasks.run_health import run_logger, say_running

AWAITING_WINDOW: Final = "AwaitingWindow"
# how often a waiting run looks at the clock (it wakes at the window's start, not later)
POLL_SECONDS: Final = 30.0


class NoMaintenanceWindow(RuntimeError):
    """No window long enough for a disruptive step within the calendar's horizon."""


def wait_for_window(store_id: str, window: dict[str, Any],
                    sleep: Callable[[float], None] = time.sleep,
                    kind: str = "maintenance window") -> None:
    """Wait until the window the step asked for opens (its `wait_until`); `kind` names it in
    the log and the run's state (a download window is no maintenance window)."""
    until = window.get("wait_until")
    if until is None:
        raise NoMaintenanceWindow(f"store {store_id}: {window['reason']}")
    logger = run_logger(__name__)
    logger.warning("store %s waits: %s", store_id, window["reason"])
    say_running(AWAITING_WINDOW, f"store {store_id}: {window['reason']}")
    while (left := (until - datetime.now(UTC)).total_seconds()) > 0:
        sleep(min(left, POLL_SECONDS))
    logger.info("store %s: its %s opened; going on", store_id, kind)
    say_running("Running", f"store {store_id}: in its {kind} since {until:%H:%M} UTC")


R = TypeVar("R", bound=Mapping[str, Any])


def run_in_window(store_id: str, run_step: Callable[[], R], slot: Any = None) -> R:
    """Run a step until it finds itself in a window (a step outside one changes nothing and
    says until when to wait, in its result's `window`). `slot`: the run's fleet slots
    (tasks/slots.ReleasableSlot), given back while it waits and taken again after."""
    while True:
        result = run_step()
        window = result.get("window")
        if window is None or window["go"]:
            return result
        if slot is not None:
            slot.give_back()
        try:
            wait_for_window(store_id, window)
        finally:
            if slot is not None:
                slot.take()


def guarded_window(action: Action, store: Store, consent: Consent, settings: CalendarSettings,
                   logger: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The guard's decision on a destructive action of a step (store_rollout/guard.py), logged,
    as the step's `window` and the decision's record; ActionRefused when not asked or not
    approved."""
    decision = guard.authorize(action, store, consent,
                               disruption_seconds=settings.disruption_seconds,
                               default_calendar=settings.default_calendar)
    (logger.warning if decision.go else logger.info)("store %s: %s", store.store_id,
                                                     guard.describe(decision.record))
    return decision.window(), decision.record


def step_window(step: str, store: Store, consent: Consent, settings: CalendarSettings,
                logger: Any, *, covered_by: str = "",
                expected_seconds: float | None = None) -> dict[str, Any]:
    """A disruptive step's `window` when it destroys nothing that works: open when an earlier
    step of this run started the sequence in a window with room for this one (`covered_by`
    says which), else the store's window (its calendar, else the chain's default) with
    `expected_seconds` (default: the step's disruption_seconds) left in it."""
    if covered_by:
        reason = f"in the window {covered_by} started the sequence in"
        logger.info("store %s: %s", store.store_id, reason)
        return {"go": True, "overridden": False, "wait_until": None, "reason": reason}
    return asdict(disruption.check_window(step, store, settings.disruption_seconds,
                                          consent.ignore_windows, logger,
                                          settings.default_calendar, expected_seconds))


def install_window(reinstall: bool, store: Store, consent: Consent, settings: CalendarSettings,
                   logger: Any, retirement_covers: bool) -> tuple[dict[str, Any], Any]:
    """Step 2's window and the guard's record (None for a host never installed: its store has
    no server yet, but its site may be open, so the window has room for steps 2 to 5)."""
    if reinstall:
        return guarded_window(Action.REINSTALL_HOST, store, consent, settings, logger)
    return step_window(STEP_PXE_INSTALL_HYPERVISOR, store, consent, settings, logger,
                       covered_by="the old box's retirement" if retirement_covers else "",
                       expected_seconds=guard.sequence_seconds(
                           Action.REINSTALL_HOST, settings.disruption_seconds)), None


def creation_window(replacing: bool, store: Store, consent: Consent,
                    settings: CalendarSettings, logger: Any,
                    install_covers: bool) -> tuple[dict[str, Any], Any]:
    """Step 5's window and the guard's record: destroying the domain that exists
    (`replacing`) is the guard's; a new domain's window is covered by step 2 of this run when
    that step installed the host (`install_covers`), else the store's."""
    if replacing:
        return guarded_window(Action.RECREATE_VM, store, consent, settings, logger)
    return step_window(STEP_CREATE_VM, store, consent, settings, logger,
                       covered_by="step 2 of this run" if install_covers else ""), None
