"""Reconcile: every store's real state (Cobbler, Salt, libvirt, ERP) against Prefect's last
rollout run of it; each mismatch named with the command that settles it. Changes nothing but
table artifacts (the reconcile's, and its region's fleet view `fleet-<region>`) and a Prefect
event per store whose result changed since the last reconcile.

Wiring only: the reads are tasks/observe.py, the conclusions store_rollout/fleet/.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from store_rollout.fleet.reconcile import StoreStatus, reconcile_store
from store_rollout.fleet.render import reconcile_table
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from tasks.fleet_view import publish_fleet_view
from tasks.observe import observe_stores
from tasks.reconcile_events import emit_store_changes, previous_reconcile
from tasks.region_runs import publish_result, run_in_region, split_by_region
from tasks.run_health import beating, zombie_after

ARTIFACT_KEY = "store-reconcile"


@flow(name="store-reconcile", flow_run_name="reconcile")
@beating
def store_reconcile(inventory: str,
                    store_ids: list[str] | None = None) -> dict[str, Any]:
    """Compare every store of the inventory (or `store_ids`) on the real systems with its last
    rollout run in Prefect, and say how to settle each difference. Stores of other regions are
    read by runs of their region's copy of this deployment (subflow runs of this one).

    Args:
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        store_ids: Only these stores (default: every store of the inventory).
    """
    everything = load_inventory(inventory)
    stores = everything.select(store_ids)
    settings = load_settings()
    own, others = split_by_region(stores, settings.region)
    remote = [run_in_region.submit("store-reconcile", region,
                                   {"inventory": inventory, "store_ids": ids})
              for region, ids in others.items()]
    facts = observe_stores(own, settings, last_runs=True) if own else {}
    silent_for = zombie_after(settings.heartbeat_seconds)
    found = {s.store_id: reconcile_store(facts[s.store_id], silent_for) for s in own}
    changed = emit_store_changes(list(found.values()), previous_reconcile(ARTIFACT_KEY))
    # this region's fleet view (another region's part publishes its own)
    publish_fleet_view(settings.region, [found[s.store_id] for s in own],
                       [s.store_id for s in everything.stores if s.region == settings.region])
    for part in remote:
        read = part.result()
        found.update({sid: StoreStatus.model_validate(s) for sid, s in read["stores"].items()})
        changed += read["changed"]
    statuses = [found[s.store_id] for s in stores]  # the inventory's order
    create_table_artifact(key=ARTIFACT_KEY, table=reconcile_table(statuses),
                          description=f"reconcile of {len(statuses)} store(s)")
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status.status] = counts.get(status.status, 0) + 1
    get_run_logger().info("reconciled %d stores: %s; changed since the last reconcile: %s",
                          len(statuses), counts, changed or "none")
    result = {"counts": counts, "changed": changed,
              "stores": {s.store_id: s.model_dump(mode="json") for s in statuses}}
    publish_result("store-reconcile", result)
    return result
