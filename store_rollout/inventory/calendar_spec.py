"""A store's `calendar:` in the inventory (its own, or the inventory's `defaults.calendar`,
field by field): time zone, maintenance windows, blackout dates (store_rollout/calendar.py
reads them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from store_rollout import calendar
from store_rollout.calendar import Window

CALENDAR_FIELDS = ("time_zone", "windows", "blackout")


class CalendarSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    time_zone: str | None = Field(
        None, description="the store's IANA time zone, e.g. Europe/Berlin")
    windows: list[str] | None = Field(
        None, description='weekly maintenance windows in local time, e.g. "Mon-Sat 22:00-06:00"')
    blackout: list[str] | None = Field(
        None, description='days without maintenance, e.g. "2026-12-24", "2026-12-20..2027-01-06"')

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None:
            calendar.zone(value.strip())
            return value.strip()
        return value

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("no maintenance window: give at least one, e.g. "
                             '"Mon-Sat 22:00-06:00" (or leave windows out to use the defaults)')
        for text in value:
            calendar.parse_window(text)
        return [" ".join(text.split()) for text in value]

    @field_validator("blackout")
    @classmethod
    def _blackout(cls, value: list[str] | None) -> list[str] | None:
        for text in value or []:
            calendar.parse_blackout(text)
        return None if value is None else [text.strip() for text in value]

    @property
    def complete(self) -> bool:
        return self.time_zone is not None and bool(self.windows)

    def missing(self) -> list[str]:
        return [name for name in ("time_zone", "windows") if getattr(self, name) is None]

    def next_windows(self, after: datetime, count: int = 3) -> list[Window]:
        """The window open at `after`, if any, and the next ones (at most `count`)."""
        if self.time_zone is None or not self.windows:
            raise ValueError(f"calendar without {' and '.join(self.missing())}")
        return calendar.next_windows(self.time_zone, self.windows, self.blackout or [], after,
                                     count)


def skipped_windows(spec: CalendarSpec, since: datetime,
                    until: datetime) -> list[tuple[datetime, str]]:
    """The calendar's 0-hour window occurrences in [since, until) (calendar.empty_windows_between)."""
    if spec.time_zone is None or not spec.windows:
        return []
    return calendar.empty_windows_between(spec.time_zone, spec.windows, since, until)


def next_window_of(spec: CalendarSpec | None, now: datetime) -> dict[str, object] | None:
    """A store's window open now or next, as a command shows it; None: no calendar (any
    time), or none within the calendar's horizon (`{"none": ...}`)."""
    if spec is None:
        return None
    found = spec.next_windows(now, 1)
    return found[0].as_dict(now) if found else {
        "none": f"no maintenance window within {calendar.HORIZON.days} days (blackout dates?)"}


def with_default_calendar(raw: Any) -> Any:
    """The raw inventory with `defaults.calendar`'s fields copied into each store's calendar
    where the store does not set them. Defaults that are invalid on their own are not copied:
    their error is reported once, at `defaults.calendar`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("stores"), list):
        return raw
    defaults = raw.get("defaults")
    given = defaults.get("calendar") if isinstance(defaults, dict) else None
    if not isinstance(given, dict):
        return raw
    try:
        CalendarSpec.model_validate(given)
    except ValidationError:
        return raw
    stores = []
    for store in raw["stores"]:
        own = store.get("calendar", {}) if isinstance(store, dict) else None
        if isinstance(own, dict):  # anything else is the store's own error to report
            merged = {**{k: v for k, v in given.items() if k in CALENDAR_FIELDS}, **own}
            store = {**store, "calendar": merged}
        stores.append(store)
    return {**raw, "stores": stores}
