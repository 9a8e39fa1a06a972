"""The fleet view (issue 49): one row per store of a region, as `reconcile` publishes it in the
table artifact `fleet-<region>` of the Prefect UI: store, platform, image version, status (the
reconcile's verdict and its flags), last run (state and start) and last backup (its time).

A pure function of the reconcile's results (a region's part read elsewhere comes back as
results too), linear in the stores: 1,000 rows cost milliseconds. A fact that is missing is a
word in its cell ("unknown", "none", "unreadable"), never an error: the view of a thousand stores
is not lost to one store's odd record.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from store_rollout.fleet.reconcile import StoreStatus
from store_rollout.fleet.versions import StoreVersions

FLEET_KEY_PREFIX = "fleet-"
UNKNOWN = "unknown"
COLUMNS = ("store", "platform", "image version", "status", "last run", "last backup")
_NOT_KEY = re.compile(r"[^a-z0-9-]+")
_DIGITS = re.compile(r"(\d+)")


def fleet_key(region: str) -> str:
    """The artifact key of a region's fleet view (Prefect keys: lowercase letters, digits and
    dashes; a region name is one already, anything else is folded to dashes)."""
    return FLEET_KEY_PREFIX + (_NOT_KEY.sub("-", region.lower()).strip("-") or "default")


def store_order(store_id: str) -> tuple[tuple[int, int | str], ...]:
    """Store ids in natural order: "2" before "10", "berlin-2" before "berlin-10"."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in _DIGITS.split(store_id) if part)


def utc_minute(when: str | None) -> str | None:
    """An ISO 8601 time as "YYYY-MM-DD HH:MMZ" in UTC (None: none or not a time)."""
    if not when:
        return None
    text = str(when).strip()
    for candidate in (text.replace("Z", "+00:00"), text[:19]):
        try:
            parsed = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%MZ")
    return None


def version_cell(v: StoreVersions | None) -> str:
    """The version the store runs (its VM's grain, else its disk's), with the target when it
    differs."""
    if v is None:
        return UNKNOWN
    running = v.running or v.disk
    if running is None:
        return f"{UNKNOWN} (target {v.target})"
    return running if running == v.target else f"{running} (target {v.target})"


def status_cell(s: StoreStatus) -> str:
    """The reconcile's verdict, with each flag's code: "mismatch: vm-stopped, backup-stale"."""
    codes = sorted({m.code for m in s.mismatches})
    return f"{s.status or UNKNOWN}: {', '.join(codes)}" if codes else (s.status or UNKNOWN)


def run_cell(s: StoreStatus) -> str:
    """The store's last rollout run, its state and when it started."""
    if not s.last_run or s.last_run == "none":
        return "none"
    started = utc_minute(s.last_run_started)
    if started:
        return f"{s.last_run}, started {started}"
    waiting = s.last_run.endswith((" Scheduled", " Pending", " Paused"))
    return f"{s.last_run}, {'not started' if waiting else 'start unknown'}"


def backup_cell(s: StoreStatus) -> str:
    """The store's newest backup's time, or why there is none to show."""
    line = s.last_backup or ""
    if line.startswith("unreadable"):
        return "unreadable"
    if line in ("none", "not configured"):
        return line
    return utc_minute(s.last_backup_time) or UNKNOWN


def fleet_rows(statuses: list[StoreStatus]) -> list[dict[str, str]]:
    """The fleet view's rows, one per store, in store id order."""
    return [{"store": s.store_id, "platform": s.platform or UNKNOWN,
             "image version": version_cell(s.versions), "status": status_cell(s),
             "last run": run_cell(s), "last backup": backup_cell(s)}
            for s in sorted(statuses, key=lambda s: store_order(s.store_id))]
