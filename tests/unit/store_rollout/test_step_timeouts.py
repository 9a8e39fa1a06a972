"""Every wait's default is StepTimeouts': the flow's parameters (hence the deployments', the UI's
and the API's), the tasks' own defaults and the CLI's options all read it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import typer.main

from store_rollout.step_timeouts import STEP_TIMEOUTS, StepTimeouts

# task parameter -> the StepTimeouts field it defaults to
TASK_DEFAULTS = {
    ("tasks.salt_master", "wait_for_hypervisor"): {"timeout": "hypervisor_timeout",
                                                   "stall_timeout": "hypervisor_stall_timeout"},
    ("tasks.firstboot", "firstboot"): {"timeout": "firstboot_timeout",
                                       "stall_timeout": "vm_stall_timeout",
                                       "contact_timeout": "vm_contact_timeout"},
}


def defaults_of(fn: Any) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_the_rollout_flow_takes_every_timeout_from_step_timeouts() -> None:
    from flows.rollout import store_rollout

    flow_defaults = defaults_of(store_rollout.fn)
    assert {name: flow_defaults[name] for name in StepTimeouts.model_fields} == \
        STEP_TIMEOUTS.model_dump()
    # what a deployment, the UI's form and the REST API see
    schema = store_rollout.parameters.model_dump()["properties"]
    assert {name: schema[name]["default"] for name in StepTimeouts.model_fields} == \
        STEP_TIMEOUTS.model_dump()


@pytest.mark.parametrize(("module", "task"), list(TASK_DEFAULTS))
def test_the_waiting_tasks_default_to_step_timeouts(module: str, task: str) -> None:
    fn = getattr(__import__(module, fromlist=[task]), task).fn
    wanted = {param: getattr(STEP_TIMEOUTS, field)
              for param, field in TASK_DEFAULTS[(module, task)].items()}
    assert {p: defaults_of(fn)[p] for p in wanted} == wanted


def test_the_cli_options_default_to_step_timeouts_with_their_help() -> None:
    from app.cli import app

    command = typer.main.get_command(app).commands["rollout"]  # type: ignore[attr-defined]
    options = {p.name: p for p in command.params}
    for field, info in StepTimeouts.model_fields.items():
        if field in options:
            assert options[field].default == getattr(STEP_TIMEOUTS, field), field
            assert options[field].help == info.description, field
    assert {"hypervisor_timeout", "firstboot_timeout"} <= set(options)


def test_bad_timeouts_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="hypervisor_timeout"):
        StepTimeouts(hypervisor_timeout=0)
    with pytest.raises(ValueError, match="hypervisor_timout"):
        StepTimeouts(hypervisor_timout=60)  # type: ignore[call-arg]
