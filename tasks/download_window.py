"""Staging waits for the store's download window (issue 49): image bytes cross a store's link
when the chain says they may (`download_window`, e.g. in the day at the capped rate
`image_rate_limit`), apart from the maintenance window that alone allows the switch.
store_rollout/download_window.py decides; this waits, saying so on the run as a maintenance
window's wait does (tasks/windows.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from store_rollout.download_window import download_decision
from store_rollout.inventory import Store
from store_rollout.settings_parts import ImageSettings
from tasks.windows import NoMaintenanceWindow, wait_for_window

FIELD = "download_window"


def download_time_zone(store: Store, images: ImageSettings) -> str:
    """The store's own calendar's zone, else the chain's default; neither: refused (a window
    in no zone would be a guess)."""
    zone = (store.calendar.time_zone if store.calendar else None) or images.default_time_zone
    if not zone:
        raise ValueError(f"store {store.store_id}: {FIELD} is set but the store has no time "
                         "zone: give its calendar.time_zone or STORE_ROLLOUT_DEFAULT_TIME_ZONE")
    return zone


def wait_for_download_window(store: Store, images: ImageSettings,
                             sleep: Callable[[float], None] = time.sleep,
                             now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> str:
    """Return at once inside the window (or with none set); else wait for its next opening.
    Returns why it went on, for the staging's result."""
    if images.download_window is None:
        return "no download window set: staging any time"
    decision = download_decision(FIELD, download_time_zone(store, images),
                                 images.download_window, now())
    if decision.go:
        return decision.reason
    if decision.wait_until is None:
        raise NoMaintenanceWindow(f"store {store.store_id}: {decision.reason}")
    wait_for_window(store.store_id, {"wait_until": decision.wait_until,
                                     "reason": decision.reason}, sleep, kind="download window")
    return f"waited: {decision.reason}"
