"""prefect.yaml is the one definition of the deployments: the loader (app/deployments.py) returns
what it says, `store-rollout serve` builds its deployments from it, and the lab test deploys it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from app.cli import app
from app.deployments import (
    PREFECT_YAML,
    DeploymentConfigError,
    deploy_from_source,
    deployment,
    load_deployments,
    runner_deployments,
    work_pools,
)
from tests.helpers import REPO_ROOT

RAW = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]


def expected(raw: dict[str, Any]) -> dict[str, Any]:
    """A deployment of prefect.yaml as `serve --list` prints it."""
    return {"name": raw["name"], "entrypoint": raw["entrypoint"],
            "description": raw.get("description"), "parameters": raw.get("parameters", {}),
            "tags": raw.get("tags", []),
            "schedules": [{"timezone": None, "active": True, **s} for s in raw.get("schedules", [])]}


def test_loader_returns_what_prefect_yaml_says() -> None:
    specs = load_deployments()
    assert [s.name for s in specs] == [d["name"] for d in RAW] == [
        "store-rollout", "batch-rollout", "stage-images", "store-rollback", "store-image-update",
        "store-image-revert", "store-hardware-refresh", "store-backup", "store-decommission",
        "store-plan", "store-reconcile"]
    for spec, raw in zip(specs, RAW, strict=True):
        assert spec.entrypoint == raw["entrypoint"]
        assert spec.description == raw["description"]
        assert spec.parameters == raw.get("parameters", {})
        assert list(spec.tags) == raw["tags"]
        assert spec.work_pool == raw["work_pool"]["name"]
        assert [(c.cron, c.timezone, c.active) for c in spec.schedules] == [
            (s["cron"], s["timezone"], s["active"]) for s in raw.get("schedules", [])]
        assert spec.flow().name == raw["entrypoint"].rsplit(":", 1)[1].replace("_", "-")
    assert deployment("batch-rollout").parameters["wave_size"] == 5
    assert work_pools() == {"rollout-pool"}


def test_a_worker_loads_every_entrypoint_of_prefect_yaml() -> None:
    """A worker runs an entrypoint as a script (load_flow_from_entrypoint puts flows/ first on
    sys.path), unlike `serve`, which imports flows as a package: a flow module named like a
    top-level package (flows/store_rollout.py) shadowed the core package and broke the
    batch-rollout deployment's import in every worker run."""
    script = ("import json, sys\n"
              "from prefect.flows import load_flow_from_entrypoint\n"
              "print(json.dumps([load_flow_from_entrypoint(e).name for e in sys.argv[1:]]))\n")
    entrypoints = [raw["entrypoint"] for raw in RAW]
    for entrypoint in entrypoints:  # each in a fresh process, as each worker run is
        done = subprocess.run([sys.executable, "-c", script, entrypoint], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{entrypoint}: {done.stderr[-2000:]}"
        name = entrypoint.rsplit(":", 1)[1].replace("_", "-")
        assert json.loads(done.stdout.splitlines()[-1]) == [name]


def test_no_flow_module_is_named_like_a_top_level_package() -> None:
    flow_modules = {p.stem for p in (REPO_ROOT / "flows").glob("*.py")}
    packages = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert flow_modules & packages == set()


def test_serve_builds_its_deployments_from_prefect_yaml() -> None:
    result = CliRunner().invoke(app, ["serve", "--list"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [expected(raw) for raw in RAW]
    # the RunnerDeployments themselves, as `prefect.serve` gets them
    served = runner_deployments(["batch-rollout"])
    assert [d.name for d in served] == ["batch-rollout"]
    assert (REPO_ROOT / served[0].entrypoint.split(":")[0]).resolve() == (
        REPO_ROOT / "flows" / "batch_rollout.py")
    assert served[0].schedules and served[0].schedules[0].active is False
    unknown = CliRunner().invoke(app, ["serve", "--list", "--deployment", "nope"])
    assert unknown.exit_code == 2 and "no deployment(s) ['nope']" in unknown.output


def test_keys_the_loader_would_drop_are_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load(PREFECT_YAML.read_text())
    raw["deployments"][0]["concurrency_limit"] = 3
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(DeploymentConfigError, match=r"store-rollout: keys \['concurrency_limit'\]"):
        load_deployments(path)
    raw["deployments"][0].pop("concurrency_limit")
    raw["deployments"][1]["schedules"] = [{"interval": 60}]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(DeploymentConfigError, match="only cron schedules"):
        load_deployments(path)


def test_deploy_from_source_registers_prefect_yaml_deployment(prefect_harness: None) -> None:
    """What tests/lab/test_api_workers.py does against the lab, on a throwaway server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    pool = f"test-pool-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        spec = deployment("batch-rollout")
        deploy_from_source(spec, source=str(REPO_ROOT), name="batch-rollout-pool", work_pool=pool)
        made = client.read_deployment_by_name("batch-rollout/batch-rollout-pool")
    assert (made.entrypoint, made.work_pool_name) == (spec.entrypoint, pool)
    assert made.parameters == spec.parameters and made.tags == list(spec.tags)
    assert [(s.schedule.cron, s.active) for s in made.schedules] == [("0 2 * * *", False)]
