"""Issue 49, the fleet view in a real browser: a region of 1,000 stores' view (`fleet-<region>`,
published by tasks/fleet_view.py's task in a flow run on the lab's Prefect server, from
reconcile results of synthetic stores: tests/unit/store_rollout/test_fleet_view.py) opened in
Debian's Chromium the way a person opens it (Artifacts -> its key -> the newest version): every
row is on the page (Prefect's artifact table draws them all, no pagination: counted), within a
bound, and the first, a middle and the last store read as the view says them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from lab.state import LabInfo
from store_rollout.fleet.view import COLUMNS, fleet_key, fleet_rows
from tests.helpers import REPO_ROOT
from tests.unit.store_rollout.test_fleet_view import synthetic_fleet

pytestmark = pytest.mark.lab

STORES = 1000
REGION = "ui-fleet"
# seconds the artifact's page may take, from its link's click to its 1,000th row drawn (about
# 3 s measured on this 2-core machine under other tests' load)
RENDER_BOUND = 20.0
PUBLISH = f"""
import json, sys, time
from prefect import flow
from tasks.fleet_view import publish_fleet_view
from tests.unit.store_rollout.test_fleet_view import synthetic_fleet

statuses = synthetic_fleet({STORES})

@flow(name="fleet-view-ui-test")
def publish():
    return publish_fleet_view({REGION!r}, statuses, [s.store_id for s in statuses])

began = time.perf_counter()
key = publish()
print(json.dumps({{"key": key, "publish_seconds": round(time.perf_counter() - began, 2)}}))
"""


def published(lab_env: dict[str, str]) -> dict[str, Any]:
    """The view published by a flow run of its own on the lab's server (a process of its own,
    with the lab's API and credential, as a worker runs a reconcile)."""
    out = subprocess.run([sys.executable, "-c", PUBLISH], env={**lab_env, "PYTHONPATH": str(
        REPO_ROOT)}, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_regions_fleet_view_of_1000_stores_renders_every_row(lab: LabInfo, lab_env: dict[str, str],
                                                              ui: Any) -> None:
    done = published(lab_env)
    assert done["key"] == fleet_key(REGION) == "fleet-ui-fleet"

    ui.goto(f"/artifacts/key/{done['key']}")
    link = ui.page.locator('a[href*="/artifacts/artifact/"]').first  # the newest version
    link.wait_for()
    began = time.monotonic()
    link.click()
    rows = ui.page.locator(".artifact-data-table tbody tr")
    rows.nth(STORES - 1).wait_for(timeout=RENDER_BOUND * 1000)
    took = time.monotonic() - began
    assert rows.count() == STORES  # every store, no pagination (the table draws them all)
    ui.page.get_by_text(f"{STORES} items").first.wait_for()  # the table's own count
    headers = [h.strip().lower() for h in ui.page.locator(
        ".artifact-data-table thead th").all_inner_texts()]
    assert headers == list(COLUMNS), headers
    expected = fleet_rows(synthetic_fleet(STORES))
    for i in (0, 7, 489, STORES - 1):  # live, unreadable backup, never rolled out, running
        shown = [c.strip() for c in rows.nth(i).locator("td").all_inner_texts()]
        assert shown == list(expected[i].values()), (i, shown)
    assert expected[0] == {"store": "0001", "platform": "sles16", "image version": "v2",
                           "status": "ok", "last backup": "2026-11-28 01:30Z",
                           "last run": "rollout-0001 Completed, started 2026-11-28 06:30Z"}
    assert [expected[i]["status"] for i in (7, 489, STORES - 1)] == [
        "mismatch: backup-unreadable", "not-started", "running"]
    print(json.dumps({"stores": STORES, "publish_seconds": done["publish_seconds"],
                      "render_seconds": round(took, 2)}))
    shot = ui.shot("fleet-view")
    assert shot.stat().st_size < 400_000, f"{shot}: a screenshot for docs/ui/ is kept small"
    assert took < RENDER_BOUND, f"the fleet view's {STORES} rows took {took:.1f} s to draw"
    # its search field: the stores a word names (here those whose backups could not be read)
    ui.page.get_by_placeholder("Search").fill("unreadable")
    wanted = sum(any("unreadable" in v for v in row.values()) for row in expected)
    ui.page.get_by_text(f"{wanted} of {STORES}").first.wait_for()
    assert rows.count() == wanted > 0
    ui.park()

