"""What a reconcile tells beyond its table: each store's result as the last reconcile left it
(read back from its table artifacts), and a Prefect event per store whose result changed."""

from __future__ import annotations

from store_rollout.fleet.reconcile import StoreStatus


def previous_reconcile(key: str, depth: int = 50) -> dict[str, str]:
    """{store id: fingerprint} as the newest reconcile that checked each store left it, from
    the last `depth` table artifacts `key` (a reconcile of a few stores, or of another
    inventory, does not make the others look new)."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC, limit=depth)
    fingerprints: dict[str, str] = {}
    for artifact in found:  # newest first: the first fingerprint of a store wins
        data = artifact.data
        rows = json.loads(data) if isinstance(data, str) else (data or [])
        for row in rows:
            if isinstance(row, dict) and "store" in row:
                fingerprints.setdefault(str(row["store"]), str(row.get("fingerprint", "")))
    return fingerprints


def emit_store_changes(statuses: list[StoreStatus], previous: dict[str, str]) -> list[str]:
    """A Prefect event per store whose reconcile result changed since the last one, on the
    resource `store.<id>` (where the Salt engine's events of the store are related too)."""
    from prefect.events import emit_event

    changed = []
    for status in statuses:
        before = previous.get(status.store_id)
        if before == status.fingerprint():
            continue
        changed.append(status.store_id)
        emit_event(
            event=f"store.reconcile.{status.status}",
            resource={"prefect.resource.id": f"store.{status.store_id}",
                      "prefect.resource.name": f"store {status.store_id}",
                      "store.id": status.store_id},
            related=[{"prefect.resource.id": f"prefect.tag.store-{status.store_id}",
                      "prefect.resource.role": "tag"}],
            payload={"previous": before, "now": status.fingerprint(), "systems": status.real,
                     "last_run": status.last_run,
                     "mismatches": [m.model_dump() for m in status.mismatches]})
    return changed
