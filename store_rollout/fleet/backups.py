"""A store's backups as plan and reconcile say them (issue 48): its newest snapshot on the
region's backup server (tasks/observe.py reads it through tasks/backup.py), what reconcile
flags, and what a replacement's plan says it restores."""

from __future__ import annotations

from datetime import UTC, datetime

from store_rollout import contracts
from store_rollout.fleet.facts import StoreFacts
from store_rollout.fleet.plan import StepPlan

EMPTY_DATA_DISK = "no backup of the store: the new VM starts with an empty data disk"


def backup_line(f: StoreFacts) -> str:
    """The store's last good backup in one line."""
    if not f.backups_configured:
        return "not configured"
    if f.backup_error:
        return f"unreadable: {f.backup_error}"
    last = f.last_backup
    if last is None:
        return "none"
    return f"{last['short_id']} at {last['time'][:19]}Z ({last['age_hours']:.1f} h old)"


def live_hours(f: StoreFacts, now: datetime | None = None) -> float | None:
    """Hours since the ERP's notice of the store's current VM (None: no such notice, or one
    without a readable `received`: epoch seconds or ISO 8601)."""
    received = (f.notice_for_vm() or {}).get("received")
    try:
        since = (datetime.fromtimestamp(float(received), UTC) if isinstance(received, int | float)
                 else datetime.fromisoformat(str(received)))
    except (TypeError, ValueError, OverflowError):
        return None
    since = since if since.tzinfo else since.replace(tzinfo=UTC)
    return ((now or datetime.now(UTC)) - since).total_seconds() / 3600


def backup_mismatches(f: StoreFacts) -> list[tuple[str, str, str]]:
    """(code, what, fix) of a live store (its VM notified to the ERP) whose backups are missing
    for longer than backup_max_age_hours since it went live (unknown since when: flagged), or
    older than that; nothing when backups are not configured. A server that could not be read
    is said as such, never taken for a missing backup."""
    if not f.backups_configured or f.vm_key != "accepted" or f.notice_for_vm() is None:
        return []
    fix = f"`store-rollout backup {f.store_id}` (in its window), or check its schedule"
    if f.backup_error:
        return [("backup-unreadable", f"the backups of {f.vm} could not be read: "
                 f"{f.backup_error}", "check the backup server and the Backup Credentials "
                 "Block (STORE_ROLLOUT_BACKUP_CREDENTIALS_BLOCK)")]
    last = f.last_backup
    if last is None:
        live = live_hours(f)
        if live is not None and live <= f.backup_max_age_hours:
            return []  # live for less than the bound: its first backup is not due yet
        return [("backup-missing", f"{f.vm} has no backup on the region's backup server"
                 + (f", {live:.1f} h after it went live" if live is not None else ""), fix)]
    if last["age_hours"] > f.backup_max_age_hours:
        return [("backup-stale", f"the newest backup of {f.vm} ({last['short_id']}) is "
                 f"{last['age_hours']:.1f} h old, more than backup_max_age_hours "
                 f"({f.backup_max_age_hours:g})", fix)]
    return []


def restore_detail(f: StoreFacts) -> str:
    """What a replacement does with the store's data disk, after firstboot, before the gate."""
    if not f.backups_configured:
        return "backups are not configured: the new VM starts with an empty data disk"
    if f.backup_error:
        return (f"the backup server could not be read ({f.backup_error}): the run reads it "
                "again after firstboot")
    last = f.last_backup
    if last is None:
        return EMPTY_DATA_DISK
    return (f"restore backup {last['short_id']} of {last['time'][:19]}Z "
            f"({last['age_hours']:.1f} h old) into the new VM's {contracts.DATA_DISK_MOUNT}, "
            "or a newer one if one is made before")


def with_restore(plan: list[StepPlan], f: StoreFacts, replacing: bool) -> list[StepPlan]:
    """A replacement's plan says, at its firstboot step, which backup it restores."""
    if not replacing:
        return plan
    return [p.model_copy(update={"details": [*p.details, restore_detail(f)]})
            if p.step == contracts.STEP_FIRSTBOOT else p for p in plan]
