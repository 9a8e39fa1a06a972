"""The Prefect server's deployments and flow runs as the batch, plan and reconcile read them:
a deployment checked before runs are made from it (the batch's store runs, a region's part of
a chain-wide read), and each store's newest rollout run."""

from __future__ import annotations

from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterName
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound


class DeploymentUnavailable(RuntimeError):
    """The deployment a scheduled batch creates its store runs from cannot run them."""


def check_deployment(name: str) -> str:
    """The work pool of deployment `name`; refuses one that is missing or whose pool no worker
    polls (its runs would stay Scheduled for ever), naming the fix."""
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise DeploymentUnavailable(
                f"store_deployment: Prefect has no deployment {name!r} to schedule the stores' "
                "rollouts into their windows; register prefect.yaml's deployments (`prefect "
                "deploy --all`) or run the batch now (--now, ignore_windows)") from None
        pool_name = deployment.work_pool_name or ""
        pool = client.read_work_pool(pool_name) if pool_name else None
    if pool is None or str(getattr(pool.status, "value", pool.status)) != "READY":
        raise DeploymentUnavailable(
            f"store_deployment: no worker polls work pool {pool_name or '(none)'!r} of "
            f"deployment {name!r}, so its scheduled runs would never start; start one: "
            f"`prefect worker start --pool {pool_name or '<pool>'}`")
    return pool_name


def newest_rollout_runs(client: Any, store_ids: list[str], page: int = 200) -> dict[str, Any]:
    """Each store's newest run of the store-rollout flow (UI, API, batch or CLI), if any."""
    wanted = {f"rollout-{sid}": sid for sid in store_ids}
    found: dict[str, Any] = {}
    for start in range(0, len(store_ids), page):  # a filter of a few hundred names per call
        names = list(wanted)[start:start + page]
        offset = 0
        while True:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["store-rollout"])),
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=page, offset=offset)
            for run in runs:
                found.setdefault(wanted[run.name], run)
            if len(runs) < page or all(wanted[n] in found for n in names):
                break
            offset += page
    return found
