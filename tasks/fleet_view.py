"""The fleet view's publication (issue 49): a reconcile's results of its region's stores as the
table artifact `fleet-<region>` (store_rollout/fleet/view.py builds the rows)."""

from __future__ import annotations

from collections import Counter

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from store_rollout.fleet.reconcile import StoreStatus
from store_rollout.fleet.view import fleet_key, fleet_rows


@task(name="publish_fleet_view", task_run_name="fleet-view-{region}")
def publish_fleet_view(region: str, statuses: list[StoreStatus],
                       region_store_ids: list[str]) -> str | None:
    """Publish the region's fleet view when this reconcile read every store the inventory has
    in the region (`region_store_ids`); a reconcile of some of them leaves the last full view
    as it is, rather than show a region of a few stores. Returns the artifact's key, or None."""
    key = fleet_key(region)
    read = {s.store_id for s in statuses}
    unread = [sid for sid in region_store_ids if sid not in read]
    if unread or not statuses:
        get_run_logger().info("fleet view %s not updated: this reconcile read %d of the "
                              "region's %d stores", key, len(read), len(region_store_ids))
        return None
    counts = Counter(s.status for s in statuses)
    create_table_artifact(key=key, table=fleet_rows(statuses),
                          description=f"fleet of region {region}: {len(statuses)} store(s), "
                          + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    get_run_logger().info("fleet view %s published: %d stores", key, len(statuses))
    return key
