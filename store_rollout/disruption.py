"""Steps that disrupt a store, and when they may start: inside one of the store's maintenance
windows, with time left in it for the disruption to end (store_rollout/calendar.py). Other
steps (image staging, key preparation, waits, the ERP notice) run at any time.

The expected length of each disruption is a setting (`disruption_seconds`, from the benchmarks
and production experience); an override (`--now`, the run parameter `ignore_windows`) lets an
emergency go ahead, and the run says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from store_rollout.contracts import STEP_CREATE_VM, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.inventory.calendar_spec import CalendarSpec

if TYPE_CHECKING:
    from store_rollout.inventory.models import Store

# an image update's sequence (issue 47): shutdown, switch, boot, update highstate, go-live gate,
# and a revert with its boot and gate when a check fails (store_rollout/guard.py)
STEP_IMAGE_UPDATE: Final = "image_update"
# a hardware refresh's move (issue 48): the store VM and its disks onto the new box, its
# minion back there and its go-live gate (the new box is installed ahead, outside the window)
STEP_HARDWARE_REFRESH: Final = "hardware_refresh"
# what each disruptive step does to a running store (what a window check says)
DISRUPTIVE_STEPS: Final = {
    STEP_PXE_INSTALL_HYPERVISOR: "power-cycles the store host and reinstalls it (the store "
                                 "server stops until step 6 is done)",
    STEP_CREATE_VM: "creates or resets the store server VM (it stops until firstboot is done)",
}
# how long each disruption lasts, seconds: step 2 until the host is up again (PXE install, its
# reboot into Xen, the first highstate), step 5 until firstboot's second reboot is done, an
# image update until its gate passed, or failed and the revert's passed, a hardware refresh
# from the move's start to the gate on the new box (an offline move's copy of the disks)
DEFAULT_DISRUPTION_SECONDS: Final = {STEP_PXE_INSTALL_HYPERVISOR: 2700.0, STEP_CREATE_VM: 1200.0,
                                     STEP_IMAGE_UPDATE: 1200.0, STEP_HARDWARE_REFRESH: 1800.0}


@dataclass(frozen=True)
class WindowDecision:
    """Whether a disruptive step may start now; if not, until when it waits (None: no window
    of the length it needs within the calendar's horizon)."""

    go: bool
    reason: str
    wait_until: datetime | None = None
    overridden: bool = False


# what a store without a calendar, and a chain without a default one, is told
NO_CALENDAR: Final = ("the store has no calendar and the chain no default one: give the store "
                      "its calendar (time_zone, maintenance_windows) in the inventory, or the "
                      "chain its default (STORE_ROLLOUT_DEFAULT_TIME_ZONE and "
                      "STORE_ROLLOUT_DEFAULT_MAINTENANCE_WINDOWS), or override (--now)")


def decide(step: str, calendar: CalendarSpec | None, now: datetime, expected: timedelta,
           ignore_windows: bool = False) -> WindowDecision:
    """Whether disruptive `step` may start now, with `expected` left in a window."""
    return decide_sequence(step, DISRUPTIVE_STEPS[step], calendar, now, expected, ignore_windows)


def decide_sequence(name: str, what: str, calendar: CalendarSpec | None, now: datetime,
                    expected: timedelta, ignore_windows: bool = False) -> WindowDecision:
    """Whether a disruption `name` (it `what`) of `expected` length may start now. Fails
    closed: no calendar is no window (go false, no time to wait for), unless overridden."""
    if calendar is None:
        if ignore_windows:
            return WindowDecision(True, f"window check overridden (ignore_windows): {name} "
                                        f"{what}, and {NO_CALENDAR.split(':')[0]}",
                                  overridden=True)
        return WindowDecision(False, f"{name} {what}, and {NO_CALENDAR}")
    found = calendar.next_windows(now, 50)
    current = next((w for w in found if w.contains(now)), None)
    if current is not None and current.end - now >= expected:
        return WindowDecision(True, f"{name} starts in the maintenance window "
                                    f"{current.describe()} ({_span(expected)} needed)")
    if current is not None:
        why = (f"the maintenance window {current.describe()} closes in "
               f"{_span(current.end - now)}, and {name} ({what}) takes up to {_span(expected)}")
    else:
        why = f"the store is outside its maintenance windows and {name} {what}"
    if ignore_windows:
        return WindowDecision(True, f"window check overridden (ignore_windows): {why}",
                              overridden=True)
    later = next((w for w in found if w.start > now and w.end - w.start >= expected), None)
    if later is None:
        return WindowDecision(False, f"{why}; no window of {_span(expected)} or more within "
                                     f"{len(found)} windows ahead: lengthen a window, shorten "
                                     "the blackout dates or override (--now)")
    return WindowDecision(False, f"{why}; waiting for the next window: {later.describe()}",
                          wait_until=later.start)


def check_window(step: str, store: Store, disruption_seconds: dict[str, float],
                 ignore_windows: bool, log: Any, default_calendar: CalendarSpec | None = None,
                 expected_seconds: float | None = None) -> WindowDecision:
    """`decide` for a store now (its calendar, else the chain's `default_calendar`), with the
    `disruption_seconds` setting (or `expected_seconds`: a whole sequence); the reason logged
    (a warning when the step waits or is overridden)."""
    calendar = store.calendar or default_calendar
    if store.calendar is None and default_calendar is not None:
        log.info("store %s: no calendar of its own: the chain's default calendar applies",
                 store.store_id)
    seconds = disruption_seconds[step] if expected_seconds is None else expected_seconds
    decision = decide(step, calendar, datetime.now(UTC), timedelta(seconds=seconds),
                      ignore_windows)
    (log.info if decision.go and not decision.overridden else log.warning)(
        "store %s: %s", store.store_id, decision.reason)
    return decision


def _span(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def checked_disruptions(value: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(value) - set(DEFAULT_DISRUPTION_SECONDS))
    if unknown:
        raise ValueError(f"disruption_seconds: unknown step(s) {unknown}; the disruptive steps "
                         f"are {sorted(DEFAULT_DISRUPTION_SECONDS)}")
    bad = sorted(k for k, v in value.items() if not 0 < v <= 7 * 24 * 3600)
    if bad:
        raise ValueError(f"disruption_seconds: {bad} must be seconds above 0 and at most a week")
    return {**DEFAULT_DISRUPTION_SECONDS, **value}
