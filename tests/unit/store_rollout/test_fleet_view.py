"""Issue 49, the fleet view (store_rollout/fleet/view.py): a region's table of its stores, built
from reconcile results made by hand (reconcile_store on hand-made facts); its publication as the
artifact `fleet-<region>` (tasks/fleet_view.py) on a throwaway Prefect server. The browser:
tests/lab/test_fleet_view_ui.py."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from store_rollout.fleet.facts import LastRun, StoreFacts
from store_rollout.fleet.reconcile import Mismatch, StoreStatus, reconcile_store
from store_rollout.fleet.versions import StoreVersions
from store_rollout.fleet.view import COLUMNS, fleet_key, fleet_rows, store_order, utc_minute
from tests.unit.store_rollout.test_fleet_state import ZOMBIE, fresh, rolled_out

STARTED = "2026-11-28T06:30:12+00:00"
SNAP = {"id": "c0ffee" + "0" * 58, "short_id": "c0ffee00", "time": "2026-11-28T01:30:00.123456789Z",
        "age_hours": 7.0}
FLEET_N = 1000


def as_store(facts: StoreFacts, sid: str) -> StoreFacts:
    return facts.model_copy(update={"store_id": sid, "hypervisor": f"store-{sid}-hv",
                                    "vm": f"store-{sid}-vm", "domain_name": f"store-{sid}-vm"})


def synthetic_fleet(n: int) -> list[StoreStatus]:
    """`n` stores' reconcile results, a mix of what a region holds: most live and backed up,
    some stopped, behind on their image, never rolled out, rolling out now, with a stale or an
    unreadable backup (each made by reconcile_store from facts, as the flow makes them)."""
    run = LastRun(id="r", name="rollout", state="Completed", started=STARTED)
    live = {"platform": "sles16", "image_version": "v2", "vm_image_version": "v2",
            "disk_image_version": "v2", "backups_configured": True, "last_backup": SNAP}
    kinds: list[dict[str, Any]] = [
        live, live, live, live, live,
        {**live, "domain": dict(rolled_out().domain or {}, active=False)},
        {**live, "vm_image_version": "v1", "disk_image_version": "v1"},
        {**live, "last_backup": None, "backup_error": "connection refused"},
        {**live, "last_backup": {**SNAP, "age_hours": 80.0}},
    ]
    statuses = []
    for i in range(n):
        sid = f"{i + 1:04d}"
        if i % 10 == 9:  # never rolled out, or one rolling out now
            facts = as_store(fresh(platform="sles16", last_run=None if i % 20 == 9 else run.model_copy(
                update={"name": f"rollout-{sid}", "state": "Running", "heartbeat_age": 5.0})), sid)
        else:
            facts = as_store(rolled_out(**kinds[i % 9], last_run=run.model_copy(
                update={"name": f"rollout-{sid}"})), sid)
        statuses.append(reconcile_store(facts, ZOMBIE))
    return statuses


def test_a_live_store_backed_up_is_one_row_of_words_and_times() -> None:
    facts = rolled_out(platform="sles16", image_version="v2", vm_image_version="v2",
                       disk_image_version="v2", backups_configured=True, last_backup=SNAP,
                       last_run=LastRun(id="r1", name="rollout-0042", state="Completed",
                                        started=STARTED))
    status = reconcile_store(facts, ZOMBIE)
    assert (status.last_run_started, status.last_backup_time) == (STARTED, SNAP["time"])
    assert fleet_rows([status]) == [{
        "store": "0042", "platform": "sles16", "image version": "v2", "status": "ok",
        "last run": "rollout-0042 Completed, started 2026-11-28 06:30Z",
        "last backup": "2026-11-28 01:30Z"}]


def test_flags_the_target_version_and_a_run_under_way_are_said() -> None:
    behind = rolled_out(image_version="v2", vm_image_version="v1", disk_image_version="v1",
                        domain=dict(rolled_out().domain or {}, active=False))
    [row] = fleet_rows([reconcile_store(behind, ZOMBIE)])
    assert row["image version"] == "v1 (target v2)"
    assert row["status"] == "mismatch: image-version-mismatch, vm-stopped"
    assert row["last run"] == "rollout-0042 Completed, start unknown"
    assert row["last backup"] == "not configured"
    scheduled = fresh(last_run=LastRun(id="r2", name="rollout-0042", state="Scheduled"))
    [row] = fleet_rows([reconcile_store(scheduled, ZOMBIE)])
    assert row["last run"] == "rollout-0042 Scheduled, not started"
    assert row["status"] == "running"
    [row] = fleet_rows([reconcile_store(fresh(), ZOMBIE)])
    assert (row["status"], row["last run"], row["platform"]) == ("not-started", "none", "unknown")


def test_missing_or_odd_facts_are_words_never_errors() -> None:
    bare = StoreStatus(store_id="7", status="", last_run="", real="")
    assert fleet_rows([bare]) == [{"store": "7", "platform": "unknown",
                                   "image version": "unknown", "status": "unknown",
                                   "last run": "none", "last backup": "unknown"}]
    odd = StoreStatus(store_id="8", status="mismatch", last_run="rollout-8 Failed",
                      real="", last_run_started="yesterday", last_backup="c0ffee00 at ?",
                      last_backup_time="not a time", versions=StoreVersions(target="v3",
                                                                            target_key="k"),
                      mismatches=[Mismatch(code="run-not-completed", what="w", fix="f")])
    [row] = fleet_rows([odd])
    assert row["image version"] == "unknown (target v3)"
    assert row["last run"] == "rollout-8 Failed, start unknown"
    assert row["last backup"] == "unknown"
    assert row["status"] == "mismatch: run-not-completed"
    unreadable = reconcile_store(rolled_out(backups_configured=True,
                                            backup_error="401 Unauthorized"), ZOMBIE)
    assert fleet_rows([unreadable])[0]["last backup"] == "unreadable"
    none = reconcile_store(rolled_out(backups_configured=True), ZOMBIE)
    assert fleet_rows([none])[0]["last backup"] == "none"
    assert utc_minute("2026-11-28T08:00:00+02:00") == "2026-11-28 06:00Z"
    assert utc_minute("") is None and utc_minute("2026-13-45") is None


def test_rows_are_in_store_id_order_numbers_as_numbers() -> None:
    ids = ["10", "2", "berlin-10", "0001", "berlin-2", "a", "1"]
    rows = fleet_rows([StoreStatus(store_id=sid, status="ok", last_run="none", real="")
                       for sid in ids])
    assert [r["store"] for r in rows] == ["0001", "1", "2", "10", "a", "berlin-2", "berlin-10"]
    assert sorted(["x-9", "x-10", "9"], key=store_order) == ["9", "x-9", "x-10"]


@pytest.mark.parametrize(("region", "key"), [
    ("default", "fleet-default"), ("nord-1", "fleet-nord-1"), ("Süd_West", "fleet-s-d-west"),
    ("", "fleet-default")])
def test_the_artifact_key_is_a_prefect_key(region: str, key: str) -> None:
    assert fleet_key(region) == key
    assert re.fullmatch(r"[a-z0-9-]+", fleet_key(region))


def test_a_thousand_stores_cost_milliseconds() -> None:
    statuses = synthetic_fleet(FLEET_N)
    began = time.perf_counter()
    rows = fleet_rows(list(reversed(statuses)))
    took = time.perf_counter() - began
    print(json.dumps({"fleet_rows_seconds": round(took, 4), "stores": FLEET_N}))
    assert [r["store"] for r in rows] == [f"{i:04d}" for i in range(1, FLEET_N + 1)]
    assert all(tuple(r) == COLUMNS for r in rows)
    statuses_seen = {r["status"] for r in rows}
    assert {"ok", "running", "not-started", "mismatch: vm-stopped",
            "mismatch: image-version-mismatch", "mismatch: backup-unreadable",
            "mismatch: backup-stale"} <= statuses_seen, statuses_seen
    assert took < 0.5, f"fleet_rows of {FLEET_N} stores took {took:.3f} s"


def test_the_view_is_published_only_for_a_whole_region(prefect_harness: None) -> None:
    """A reconcile of every store of the region publishes `fleet-<region>`; one of a few of
    them leaves the last full view as it is."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.fleet_view import publish_fleet_view

    statuses = synthetic_fleet(30)
    ids = [s.store_id for s in statuses]

    @flow
    def reconciles() -> list[str | None]:
        return [publish_fleet_view("test-east", statuses, ids),
                publish_fleet_view("test-east", statuses[:3], ids)]

    assert reconciles() == ["fleet-test-east", None]
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["fleet-test-east"])))
    assert len(found) == 1 and found[0].type == "table"
    data = found[0].data
    rows = json.loads(data) if isinstance(data, str) else data
    assert [r["store"] for r in rows] == ids
    assert "30 store(s)" in str(found[0].description)
