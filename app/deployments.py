"""The deployments of prefect.yaml, the one place they are written.

`prefect deploy --all` registers them for workers. `store-rollout serve` serves them from one
process (`runner_deployments`). Tests and the lab read them here too (`deploy_from_source`,
`work_pools`). The loader refuses keys it does not understand, so serve never silently drops
something prefect.yaml says.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import yaml
from prefect import Flow
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Schedule

PREFECT_YAML = Path(__file__).resolve().parent.parent / "prefect.yaml"
DEPLOYMENT_KEYS = {"name", "description", "entrypoint", "parameters", "schedules", "work_pool", "tags"}
SCHEDULE_KEYS = {"cron", "timezone", "active"}


class DeploymentConfigError(ValueError):
    """prefect.yaml has a deployment this loader cannot represent faithfully."""


@dataclass(frozen=True)
class CronSpec:
    cron: str
    timezone: str | None = None
    active: bool = True

    def schedule(self) -> Schedule:
        return Cron(self.cron, timezone=self.timezone, active=self.active)


@dataclass(frozen=True)
class DeploymentSpec:
    """One entry of prefect.yaml's `deployments:`."""

    name: str
    entrypoint: str  # "flows/rollout.py:store_rollout", relative to the repository
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    schedules: tuple[CronSpec, ...] = ()
    tags: tuple[str, ...] = ()
    work_pool: str | None = None

    def flow(self) -> Flow[Any, Any]:
        """The flow object, imported as a module of this package (a script import would load
        flows/ twice and break their imports of each other)."""
        path, _, attr = self.entrypoint.partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        found = getattr(module, attr)
        if not isinstance(found, Flow):
            raise DeploymentConfigError(f"{PREFECT_YAML.name}: {self.name}: {self.entrypoint} "
                                        "is not a Prefect flow")
        return found

    def runner_deployment(self) -> RunnerDeployment:
        """What `store-rollout serve` serves: this deployment run by the serving process."""
        return cast(RunnerDeployment, self.flow().to_deployment(
            name=self.name, description=self.description or None, parameters=self.parameters,
            tags=list(self.tags), schedules=[s.schedule() for s in self.schedules]))


def _spec(raw: dict[str, Any]) -> DeploymentSpec:
    name = raw.get("name", "?")
    unknown = set(raw) - DEPLOYMENT_KEYS
    if unknown:
        raise DeploymentConfigError(f"{PREFECT_YAML.name}: deployment {name}: keys "
                                    f"{sorted(unknown)} are not read by app/deployments.py")
    schedules = []
    for sched in raw.get("schedules") or []:
        if set(sched) - SCHEDULE_KEYS or "cron" not in sched:
            raise DeploymentConfigError(f"{PREFECT_YAML.name}: deployment {name}: only cron "
                                        f"schedules with {sorted(SCHEDULE_KEYS)} are read: {sched}")
        schedules.append(CronSpec(sched["cron"], sched.get("timezone"), sched.get("active", True)))
    return DeploymentSpec(
        name=raw["name"], entrypoint=raw["entrypoint"], description=raw.get("description", ""),
        parameters=dict(raw.get("parameters") or {}), schedules=tuple(schedules),
        tags=tuple(raw.get("tags") or ()), work_pool=(raw.get("work_pool") or {}).get("name"))


def load_deployments(path: Path = PREFECT_YAML) -> list[DeploymentSpec]:
    """Every deployment of prefect.yaml, in file order."""
    return [_spec(raw) for raw in yaml.safe_load(path.read_text())["deployments"]]


def deployment(name: str, path: Path = PREFECT_YAML) -> DeploymentSpec:
    for spec in load_deployments(path):
        if spec.name == name:
            return spec
    raise DeploymentConfigError(f"{path.name} has no deployment {name!r}")


# deployments that serve the whole chain (their runs dispatch to the regions'); every other one
# drives a region's systems, so each region has its copy in its own work pool
CHAIN_DEPLOYMENTS = frozenset({"batch-rollout"})


def regional_specs(path: Path = PREFECT_YAML) -> list[DeploymentSpec]:
    """The deployments each region has a copy of (`<name>-<region>`, in its work pool)."""
    return [spec for spec in load_deployments(path) if spec.name not in CHAIN_DEPLOYMENTS]


def work_pools(path: Path = PREFECT_YAML) -> set[str]:
    return {spec.work_pool for spec in load_deployments(path) if spec.work_pool}


def runner_deployments(names: list[str] | None = None,
                       path: Path = PREFECT_YAML) -> list[RunnerDeployment]:
    """The deployments `store-rollout serve` serves: all of prefect.yaml's, or those named."""
    specs = load_deployments(path)
    unknown = set(names or ()) - {s.name for s in specs}
    if unknown:
        raise DeploymentConfigError(f"{path.name} has no deployment(s) {sorted(unknown)}")
    return [s.runner_deployment() for s in specs if not names or s.name in names]


def deploy_from_source(spec: DeploymentSpec, *, source: str, name: str | None = None,
                       work_pool: str | None = None) -> UUID:
    """Register `spec` for a worker, with the code at `source`; `name` and `work_pool` override
    prefect.yaml's (a test's own pool beside the lab's)."""
    flow = cast(Flow[Any, Any], Flow.from_source(source=source, entrypoint=spec.entrypoint))
    return cast(UUID, flow.deploy(
        name=name or spec.name, work_pool_name=work_pool or spec.work_pool,
        description=spec.description or None, parameters=spec.parameters, tags=list(spec.tags),
        schedules=[s.schedule() for s in spec.schedules], print_next_steps=False))


def served_as_json(served: RunnerDeployment) -> dict[str, Any]:
    """What `store-rollout serve --list` prints of one deployment."""
    return {"name": served.name, "entrypoint": served.entrypoint,
            "description": served.description, "parameters": served.parameters,
            "tags": served.tags,
            "schedules": [{"cron": getattr(s.schedule, "cron", None),
                           "timezone": getattr(s.schedule, "timezone", None), "active": s.active}
                          for s in served.schedules or []]}
