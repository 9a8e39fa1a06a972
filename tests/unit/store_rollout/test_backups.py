"""A store's backups as reconcile and plan say them (store_rollout/fleet/backups.py), and a
backup run's verification (store_rollout/backups.py): pure data, no server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from store_rollout.backups import BackupNotVerified, backup_window, verified
from store_rollout.contracts import STEP_FIRSTBOOT
from store_rollout.fleet.backups import EMPTY_DATA_DISK, backup_line, with_restore
from store_rollout.fleet.plan import plan_store
from store_rollout.fleet.reconcile import reconcile_store
from store_rollout.inventory.calendar_spec import CalendarSpec
from tests.unit.store_rollout.test_fleet_state import UUID, ZOMBIE, fresh, rolled_out

SNAP = {"id": "c0ffee" + "0" * 58, "short_id": "c0ffee00", "time": "2026-11-27T01:30:00Z",
        "age_hours": 3.0}


def codes(**changes: Any) -> list[str]:
    return [m.code for m in reconcile_store(rolled_out(**changes), ZOMBIE).mismatches]


def test_reconcile_flags_a_missing_or_stale_backup_only_when_backups_are_configured() -> None:
    assert codes() == []  # not configured: nothing said
    assert reconcile_store(rolled_out(), ZOMBIE).last_backup == "not configured"
    assert codes(backups_configured=True) == ["backup-missing"]
    assert codes(backups_configured=True, last_backup=SNAP) == []
    stale = {**SNAP, "age_hours": 49.5}
    assert codes(backups_configured=True, last_backup=stale) == ["backup-stale"]
    assert codes(backups_configured=True, last_backup=stale, backup_max_age_hours=72) == []
    status = reconcile_store(rolled_out(backups_configured=True, last_backup=stale), ZOMBIE)
    assert status.status == "mismatch" and "49.5 h old" in status.mismatches[0].what
    assert status.last_backup == "c0ffee00 at 2026-11-27T01:30:00Z (49.5 h old)"
    assert "store-rollout backup 0042" in status.mismatches[0].fix


def test_a_store_live_for_less_than_the_bound_is_not_missing_its_backup_yet() -> None:
    def live_since(hours: float, form: str) -> list[dict[str, Any]]:
        at = datetime.now(UTC).timestamp() - hours * 3600
        received = at if form == "epoch" else datetime.fromtimestamp(at, UTC).isoformat()
        return [{"id": "ERP-1", "idempotency_key": "k", "vm_uuid": UUID, "received": received}]

    for form in ("epoch", "iso"):
        assert codes(backups_configured=True, erp_notices=live_since(2, form)) == []
        assert codes(backups_configured=True, erp_notices=live_since(50, form)) == [
            "backup-missing"]
    # not live (no notice of this VM): other mismatches say so, not this one
    assert "backup-missing" not in codes(backups_configured=True, erp_notices=[])


def test_an_unreadable_server_is_never_taken_for_a_missing_backup() -> None:
    assert codes(backups_configured=True, backup_error="HTTP 503") == ["backup-unreadable"]


def test_a_store_without_a_vm_is_not_flagged() -> None:
    store = fresh(backups_configured=True)
    assert "backup-missing" not in [m.code for m in reconcile_store(store, ZOMBIE).mismatches]


@pytest.mark.parametrize(("changes", "said"), [
    ({}, "backups are not configured: the new VM starts with an empty data disk"),
    ({"backups_configured": True}, EMPTY_DATA_DISK),
    ({"backups_configured": True, "last_backup": SNAP},
     "restore backup c0ffee00 of 2026-11-27T01:30:00Z (3.0 h old) into the new VM's /srv/store"),
])
def test_a_replacements_plan_says_which_backup_it_restores(changes: dict[str, Any],
                                                            said: str) -> None:
    facts = rolled_out(**changes)
    plan = with_restore(plan_store(facts, replace_box=True), facts, True)
    firstboot = next(p for p in plan if p.step == STEP_FIRSTBOOT)
    assert any(d.startswith(said) for d in firstboot.details), firstboot.details
    untouched = with_restore(plan_store(facts), facts, False)
    assert untouched == plan_store(facts)
    assert backup_line(facts) in ("not configured", "none", "c0ffee00 at 2026-11-27T01:30:00Z "
                                  "(3.0 h old)")


def test_a_backup_is_verified_only_when_listed_and_checked() -> None:
    made = {"snapshot": SNAP["id"]}
    assert verified("0042", made, [SNAP], {"ok": True}) == SNAP
    with pytest.raises(BackupNotVerified, match="c0ffee00 the VM made is not in its repository"):
        verified("0042", made, [], {"ok": True})
    with pytest.raises(BackupNotVerified, match="restic check"):
        verified("0042", made, [SNAP], {"ok": False, "summary": ["damaged"]})


def test_a_backup_waits_for_the_stores_window() -> None:
    from store_rollout.inventory import Store

    night = CalendarSpec(time_zone="UTC", windows=["daily 01:00-03:00"])
    store = Store.model_validate({
        "store_id": "0042", "erp": {"site_code": "S-0042"}, "calendar": night.model_dump(),
        "hypervisor": {"mac": "52:54:00:00:00:42", "hostname": "hv-0042.invalid"}})
    calendar: Any = type("Cal", (), {"default_calendar": None})()
    noon = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    waits = backup_window(store, calendar, False, now=noon)
    assert not waits.go and waits.wait_until == datetime(2026, 11, 28, 1, 0, tzinfo=UTC)
    assert backup_window(store, calendar, True, now=noon).overridden
    assert backup_window(store, calendar, False, now=noon.replace(hour=1)).go
