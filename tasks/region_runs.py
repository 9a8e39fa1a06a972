"""A chain-wide read (plan, reconcile) of stores of other regions: each region's part is a run
of the region's copy of the same deployment, in the region's work pool, where a worker reads
the region's own Salt master and Cobbler; the dispatching run waits for it and takes its
result from the artifact it published (results stay on the worker that ran them: the Prefect
server is what both runs share).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any, Final, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment

from store_rollout.inventory import Store
from store_rollout.regions import regional_deployment
from tasks.flow_runs import check_deployment

RESULT_SUFFIX: Final = "-result"
REGION_RUN_TIMEOUT: Final = 900.0  # seconds a region's part may take (plans run highstate tests)
_JSON_BLOCK = re.compile(r"```json\n(.*)\n```", re.DOTALL)


class RegionRunFailed(RuntimeError):
    """A region's part of a chain-wide run did not complete; the message names the region."""


def split_by_region(stores: list[Store], serving: str) -> tuple[list[Store], dict[str, list[str]]]:
    """This process's region's stores, and the others' ids by region."""
    others: dict[str, list[str]] = defaultdict(list)
    for store in stores:
        if store.region != serving:
            others[store.region].append(store.store_id)
    return [s for s in stores if s.region == serving], dict(others)


def publish_result(flow_name: str, result: dict[str, Any]) -> None:
    """The run's result as an artifact, for a chain-wide run that dispatched it."""
    create_markdown_artifact(key=f"{flow_name}{RESULT_SUFFIX}",
                             markdown=f"```json\n{json.dumps(result, indent=1, default=str)}\n```",
                             description=f"{flow_name}'s result (read by the chain-wide run)")


def _published(run_id: UUID, key: str) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]), key=ArtifactFilterKey(any_=[key])))
    match = _JSON_BLOCK.fullmatch(str(found[0].data)) if found else None
    if match is None:
        raise RegionRunFailed(f"run {run_id} published no {key!r} artifact")
    return cast(dict[str, Any], json.loads(match.group(1)))


@task(name="run_in_region", task_run_name="{flow_name}-in-{region}")
def run_in_region(flow_name: str, region: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """`flow_name`'s deployment copy of `region` run with `parameters` (a subflow run of this
    one, in the region's pool), awaited; its published result."""
    deployment = regional_deployment(f"{flow_name}/{flow_name}", region)
    check_deployment(deployment)  # a pool without a worker: refused now, not waited on
    run = cast(FlowRun, run_deployment(deployment, parameters=parameters,
                                       timeout=REGION_RUN_TIMEOUT, poll_interval=2))
    state = run.state
    if state is None or not state.is_completed():
        name = state.name if state else "not started"
        raise RegionRunFailed(f"region {region}: run {run.name} ({run.id}) of {deployment} is "
                              f"{name} after {REGION_RUN_TIMEOUT:.0f} s at most: "
                              f"{(state.message if state else '') or 'see its page'}")
    get_run_logger().info("region %s: run %s of %s completed", region, run.name, deployment)
    return _published(run.id, f"{flow_name}{RESULT_SUFFIX}")
