"""A store's download window: when staging (stage-images, an update's staging) may move image
bytes over the store's link, at the capped rate `image_rate_limit`. It is apart from the
maintenance window, which alone allows the switch (the update's apply).

Spelled like a maintenance window (store_rollout/calendar.py), in the store's time zone:
`download_window: ["daily 00:00-06:00"]`. None (not set) means staging may run any time, as
before; a malformed entry fails closed, naming the field and how to write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from store_rollout.calendar import WINDOW_HOW, next_windows, parse_window, zone


@dataclass(frozen=True)
class DownloadDecision:
    """Now inside the window (`go`), or not: then `wait_until` (UTC) is its next opening."""

    go: bool
    wait_until: datetime | None
    reason: str


def checked_download_window(field: str, time_zone: str, windows: list[str]) -> list[str]:
    """`windows` as given, or ValueError naming `field` and the fix (nothing done yet)."""
    if not windows:
        raise ValueError(f"{field}: empty; give windows like \"daily 00:00-06:00\" or leave "
                         "the field out (staging any time)")
    try:
        zone(time_zone)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    for text in windows:
        try:
            parse_window(text)
        except ValueError:
            raise ValueError(f"{field}: {text!r} is not a window; {WINDOW_HOW}") from None
    return windows


def download_decision(field: str, time_zone: str, windows: list[str] | None,
                      now: datetime) -> DownloadDecision:
    """Whether staging may download now (`now` aware, UTC)."""
    if windows is None:
        return DownloadDecision(True, None, "no download window set: staging any time")
    found = next_windows(time_zone, checked_download_window(field, time_zone, windows), [], now,
                         count=1)
    if not found:
        return DownloadDecision(False, None, f"{field}: no window ahead")
    if found[0].contains(now):
        return DownloadDecision(True, None, f"in the download window {found[0].describe()}")
    return DownloadDecision(False, found[0].start,
                            f"outside the download window: waits for {found[0].describe()}")
