"""A store's backup run (issue 48) as data: whether the snapshot the VM made is verified, the
run's window, what its artifact says, and what a replacement's restore says. The flow is
flows/store_backup.py, the calls tasks/store_backup.py and tasks/backup.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from store_rollout.disruption import WindowDecision, decide_sequence
from store_rollout.inventory import Store
from store_rollout.settings_parts import CalendarSettings

# a backup disrupts nothing, but it loads the store's disk and uplink: it runs in the store's
# window (the issue asks for it), with this much of the window left
BACKUP_SECONDS: Final = 1800.0
BACKUP_WHAT: Final = "copies the store's data disk to the region's backup target"


class BackupNotVerified(RuntimeError):
    """The snapshot the VM made is not listed by the admin side, or the repository's check
    failed."""


def backup_window(store: Store, calendar: CalendarSettings, ignore_windows: bool,
                  now: datetime | None = None) -> WindowDecision:
    """Whether the store's backup may start now (its calendar, else the chain's default)."""
    return decide_sequence("the backup", BACKUP_WHAT, store.calendar or calendar.default_calendar,
                           now or datetime.now(UTC), timedelta(seconds=BACKUP_SECONDS),
                           ignore_windows)


def verified(store_id: str, made: dict[str, Any], listed: list[dict[str, Any]],
             checked: dict[str, Any]) -> dict[str, Any]:
    """The VM's new snapshot as the admin side lists it, the repository checked; raises
    BackupNotVerified otherwise."""
    found = next((s for s in listed if s["id"] == made["snapshot"]), None)
    if found is None:
        raise BackupNotVerified(f"store {store_id}: snapshot {made['snapshot'][:8]} the VM "
                                "made is not in its repository as the backup server lists it")
    if not checked.get("ok"):
        raise BackupNotVerified(f"store {store_id}: restic check of its repository failed: "
                                f"{checked.get('summary')}")
    return found


def backup_markdown(result: dict[str, Any]) -> str:
    """The `backup-<store>` artifact."""
    kept = result["retention"]
    return (f"# Store {result['store_id']} backup\n\n"
            f"- snapshot: `{result['snapshot']}` at {result['time']}\n"
            f"- files: {result['files']}, bytes: {result['bytes']} "
            f"(new data: {result['added_bytes']} bytes) in {result['seconds']} s\n"
            f"- verified: listed by the backup server, `restic check` passed\n"
            f"- retention: kept {len(kept['kept'])}, removed {len(kept['removed'])} "
            f"(keep daily {result['keep_daily']}, weekly {result['keep_weekly']})\n"
            f"- window: {result['window']}\n")


def restored_line(restored: dict[str, Any] | None) -> str:
    """A replacement's data disk in one line (its rollout artifact)."""
    if not restored:
        return ""
    if restored.get("snapshot"):
        age = restored.get("age_hours")
        return (f"- data disk restored from backup `{restored['short_id']}` of "
                f"{restored['time']} ({'?' if age is None else f'{age:.1f}'} h old)\n")
    return f"- data disk: {restored['note']}\n"
