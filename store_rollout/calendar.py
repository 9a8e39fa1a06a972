"""A store's maintenance calendar: its IANA time zone, weekly maintenance windows in the store's
own local time (overnight windows allowed) and blackout dates, and the windows that follow from
them, in local time and UTC.

Windows are weekly RFC 5545 recurrences (dateutil's `rrule`) of a local start time; each one
ends at its local end time, both placed on the time line by the store's zone (`zoneinfo`), so a
window across a daylight-saving change is as long as the clock on the store's wall says (a
22:00-06:00 window is 7 h on the night clocks go forward, 9 h when they go back). A blackout
date takes its whole local day out of every window (a window inside it is gone, one across its
edge is cut there).

Spelling (YAML lists, or one CSV cell with `;` between entries):
  windows:  "Mon-Sat 22:00-06:00", "Sun 00:00-24:00", "Mon,Wed,Fri 21:30-23:00", "daily 02:00-04:00"
  blackout: "2026-12-24", "2026-12-20..2027-01-06" (both days included)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from dateutil.rrule import WEEKLY, rrule

DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_DAY = "|".join(DAYS)
_CLOCK = r"(?:[01]\d|2[0-3]):[0-5]\d"
WINDOW_RE: Final = re.compile(
    rf"^(?P<days>daily|(?:{_DAY})(?:-(?:{_DAY}))?(?:,(?:{_DAY})(?:-(?:{_DAY}))?)*)\s+"
    rf"(?P<start>{_CLOCK})-(?P<end>{_CLOCK}|24:00)$")
BLACKOUT_RE: Final = re.compile(r"^(?P<first>\d{4}-\d{2}-\d{2})(?:\.\.(?P<last>\d{4}-\d{2}-\d{2}))?$")
WINDOW_HOW: Final = ('write days and local times like "Mon-Sat 22:00-06:00", "Sun 00:00-24:00" '
                     'or "daily 02:00-04:00" (days Mon..Sun, ranges with "-", lists with ",")')
BLACKOUT_HOW: Final = 'write a date like "2026-12-24" or a range "2026-12-20..2027-01-06"'
# how far ahead windows are looked for (a calendar blacked out for longer has none)
HORIZON: Final = timedelta(days=400)


@dataclass(frozen=True)
class WeeklyWindow:
    """One entry of `windows`: local start on each of `weekdays` (0 = Monday), local length."""

    weekdays: tuple[int, ...]
    start: time
    end: time  # time(0) with `to_midnight`: 24:00
    to_midnight: bool
    text: str

    def wall_length(self) -> timedelta:
        start = timedelta(hours=self.start.hour, minutes=self.start.minute)
        end = timedelta(days=1) if self.to_midnight else timedelta(hours=self.end.hour,
                                                                  minutes=self.end.minute)
        return end - start if end > start else end + timedelta(days=1) - start


def parse_window(text: str) -> WeeklyWindow:
    """A window as written; ValueError naming how to write it."""
    match = WINDOW_RE.fullmatch(" ".join(text.split()))
    if not match:
        raise ValueError(f"invalid maintenance window {text!r}: {WINDOW_HOW}")
    weekdays: list[int] = []
    if match["days"] == "daily":
        weekdays = list(range(7))
    else:
        for part in match["days"].split(","):
            first, _, last = part.partition("-")
            a, b = DAYS.index(first), DAYS.index(last or first)
            weekdays += [d % 7 for d in range(a, b + 1 if b >= a else b + 8)]
    start = time.fromisoformat(match["start"])
    to_midnight = match["end"] == "24:00"
    end = time(0) if to_midnight else time.fromisoformat(match["end"])
    if start == end and not to_midnight:
        raise ValueError(f"maintenance window {text!r} is empty (it starts when it ends): "
                         f"give it a length, e.g. {match['days']} {match['start']}-"
                         f"{(datetime.combine(date.min, start) + timedelta(hours=2)).time():%H:%M}")
    return WeeklyWindow(tuple(sorted(set(weekdays))), start, end, to_midnight, text)


def parse_blackout(text: str) -> tuple[date, date]:
    """A blackout entry as its first and last local day; ValueError naming how to write it."""
    match = BLACKOUT_RE.fullmatch(text.strip())
    try:
        if not match:
            raise ValueError
        first = date.fromisoformat(match["first"])
        last = date.fromisoformat(match["last"]) if match["last"] else first
    except ValueError:
        raise ValueError(f"invalid blackout date {text!r}: {BLACKOUT_HOW}") from None
    if last < first:
        raise ValueError(f"blackout range {text!r} ends before it starts: write the earlier "
                         "day first")
    return first, last


# the areas of canonical IANA zone names (Area/Location); with UTC the only names taken: no
# `localtime`, `Factory`, `EST` or `US/Eastern`-style legacy names, which follow a machine's
# setting or an old convention rather than a place's clocks
ZONE_AREAS: Final = ("Africa", "America", "Antarctica", "Arctic", "Asia", "Atlantic",
                     "Australia", "Europe", "Indian", "Pacific")


def zone(name: str) -> ZoneInfo:
    """A canonical IANA time zone; ValueError naming how to write one."""
    try:
        if name not in available_timezones() or not (
                name == "UTC" or name.split("/", 1)[0] in ZONE_AREAS and "/" in name):
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown or non-canonical time zone {name!r}: use the IANA name of "
                         "the store's place, like Europe/Berlin, America/New_York or "
                         "Asia/Tokyo (or UTC)") from None


@dataclass(frozen=True)
class Window:
    """One maintenance window on the time line."""

    start: datetime  # UTC
    end: datetime  # UTC
    time_zone: str

    def local(self, moment: datetime) -> datetime:
        return moment.astimezone(ZoneInfo(self.time_zone))

    @property
    def hours(self) -> float:
        return round((self.end - self.start).total_seconds() / 3600, 2)

    def contains(self, moment: datetime) -> bool:
        return self.start <= moment < self.end

    def as_dict(self, now: datetime) -> dict[str, object]:
        """What a command prints or a flow returns for it (ISO times, local and UTC)."""
        return {"time_zone": self.time_zone, "hours": self.hours, "open_now": self.contains(now),
                "start_local": self.local(self.start).isoformat(),
                "end_local": self.local(self.end).isoformat(),
                "start_utc": self.start.isoformat(), "end_utc": self.end.isoformat(),
                "text": self.describe()}

    def describe(self) -> str:
        start, end = self.local(self.start), self.local(self.end)
        return (f"{start:%a %Y-%m-%d %H:%M} - {end:%a %H:%M} {end:%Z} ({self.time_zone}); "
                f"{self.start:%Y-%m-%d %H:%M} - {self.end:%H:%M} UTC, {self.hours:g} h")


def _occurrences(weekly: WeeklyWindow, tz: ZoneInfo, since: datetime,
                 until: datetime) -> list[tuple[datetime, datetime]]:
    # from the local day before `since`: an overnight window begun then may still be open
    first_day = since.astimezone(tz).date() - timedelta(days=1)
    starts = rrule(WEEKLY, byweekday=weekly.weekdays, byhour=weekly.start.hour,
                   byminute=weekly.start.minute, bysecond=0,
                   dtstart=datetime.combine(first_day, time(0)),
                   until=datetime.combine(until.astimezone(tz).date() + timedelta(days=1), time(0)))
    found = []
    for local_start in starts:
        local_end = local_start + weekly.wall_length()  # wall-clock arithmetic, then placed
        start = local_start.replace(tzinfo=tz).astimezone(UTC)
        end = local_end.replace(tzinfo=tz).astimezone(UTC)
        if end > since and start < until:
            found.append((start, end))
    return found


def _cut(intervals: list[tuple[datetime, datetime]],
         holes: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """Intervals minus holes, merged where they touch."""
    pieces = []
    for start, end in sorted(intervals):
        parts = [(start, end)]
        for hole_start, hole_end in holes:
            parts = [p for a, b in parts for p in ((a, min(b, hole_start)), (max(a, hole_end), b))
                     if p[0] < p[1]]
        pieces += parts
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(pieces):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def windows_between(time_zone: str, windows: list[str], blackout: list[str], since: datetime,
                    until: datetime) -> list[Window]:
    """The maintenance windows open at some moment of [since, until), in time order."""
    tz = zone(time_zone)
    intervals = [occurrence for text in windows
                 for occurrence in _occurrences(parse_window(text), tz, since, until)]
    holes = []
    for text in blackout:
        first, last = parse_blackout(text)
        holes.append((datetime.combine(first, time(0), tz).astimezone(UTC),
                      datetime.combine(last + timedelta(days=1), time(0), tz).astimezone(UTC)))
    # a 0-hour occurrence (inside the hour the clocks skip) is no window: skipped here, shown
    # by empty_windows_between
    return [Window(start, end, time_zone) for start, end in _cut(intervals, holes) if end > start]


def next_windows(time_zone: str, windows: list[str], blackout: list[str], after: datetime,
                 count: int = 3) -> list[Window]:
    """The window open at `after` (if one is) and the ones after it, at most `count`."""
    found: list[Window] = []
    since = after
    while len(found) < count and since < after + HORIZON:
        until = min(since + timedelta(days=35), after + HORIZON)
        batch = [w for w in windows_between(time_zone, windows, blackout, since, until)
                 if w.end > after and all(w.start != f.start for f in found)]
        found += batch
        since = until
    return found[:count]


def empty_windows_between(time_zone: str, windows: list[str], since: datetime,
                          until: datetime) -> list[tuple[datetime, str]]:
    """Window occurrences that last 0 h on the time line, as (UTC moment, the window as
    written): a window inside the hour the clocks skip (02:00-03:00 on the night they go
    forward). `next_windows` never offers them; commands show them, skipped."""
    tz = zone(time_zone)
    found = [(start, text) for text in windows
             for start, end in _occurrences(parse_window(text), tz, since, until)
             if start == end and since <= start < until]
    return sorted(found)
