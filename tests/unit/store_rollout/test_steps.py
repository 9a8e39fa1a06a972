"""store_rollout/steps.py: who hears of a rollout's steps. A listener is set for a block
(`steps.listening`) and hears the runs started inside it, in its thread and in the threads and
task runs started from it (they run in a copy of its context), and no other: two commands,
tests or batch rows in one process do not hear each other's stores. No process-wide list."""

from __future__ import annotations

import ast
import contextvars
import threading
from pathlib import Path

import pytest

from store_rollout import steps
from store_rollout.steps import StepClock
from tests.helpers import REPO_ROOT

Heard = list[tuple[str, str, str]]


def recorder(heard: Heard) -> steps.StepListener:
    return lambda store, step, state, _seconds: heard.append((store, step, state))


def test_a_listener_hears_the_steps_run_inside_its_block_only() -> None:
    heard: Heard = []
    StepClock("s0").run("image", lambda: None)  # before: nobody listens
    with steps.listening(recorder(heard)):
        StepClock("s1").run("image", lambda: 1)
    StepClock("s2").run("image", lambda: None)  # after: nobody listens
    assert heard == [("s1", "image", "running"), ("s1", "image", "done")]


def test_nested_listeners_both_hear_and_the_inner_one_ends_with_its_block() -> None:
    outer: Heard = []
    inner: Heard = []
    with steps.listening(recorder(outer)):
        with steps.listening(recorder(inner)):
            steps._notify("s1", "image", "running", 0.0)
        steps._notify("s1", "create_vm", "running", 0.0)
    assert inner == [("s1", "image", "running")]
    assert outer == [("s1", "image", "running"), ("s1", "create_vm", "running")]


def test_threads_started_with_the_context_hear_and_others_do_not() -> None:
    """As the CLI's runner and Prefect's task runners start them: in a copy of the context."""
    heard: Heard = []
    with steps.listening(recorder(heard)):
        context = contextvars.copy_context()
    elsewhere = threading.Thread(target=steps._notify, args=("s2", "image", "running", 0.0))
    elsewhere.start()
    elsewhere.join()
    inside = threading.Thread(target=context.run, args=(steps._notify, "s1", "image",
                                                        "running", 0.0))
    inside.start()
    inside.join()
    assert heard == [("s1", "image", "running")]


def test_a_failed_step_is_heard_as_failed() -> None:
    heard: Heard = []

    def broken() -> None:
        raise RuntimeError("down")

    with steps.listening(recorder(heard)), pytest.raises(RuntimeError):
        StepClock("s-listen").run("create_vm", broken)
    steps.take_failed_step("s-listen")
    assert heard == [("s-listen", "create_vm", "running"), ("s-listen", "create_vm", "failed")]


def module_level_lists(path: Path) -> list[str]:
    """Module-level names bound to a list (a literal, a `list[...]`-annotated value or list())."""
    found = []
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        is_list = isinstance(value, ast.List | ast.ListComp) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", "") == "list")
        if is_list:
            found += [ast.unparse(target) for target in targets]
    return found


def test_steps_keeps_no_process_wide_listener_list(tmp_path: Path) -> None:
    assert module_level_lists(REPO_ROOT / "store_rollout" / "steps.py") == []
    planted = tmp_path / "steps.py"
    planted.write_text("from typing import Any\n\n_listeners: list[Any] = []\nOTHER = list()\n"
                       "NAMES = ('a',)\n")
    assert module_level_lists(planted) == ["_listeners", "OTHER"]


def test_prefect_runs_started_inside_the_block_hear_it(prefect_harness: None) -> None:
    """As the CLI's batch: the listener set around a flow call hears the steps run in the
    flow, and in a subflow called from a task the flow submitted to its thread pool."""
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    @flow(name="steps-heard-store")
    def store(store_id: str) -> None:
        StepClock(store_id).run("image", lambda: None)

    @task(name="steps-heard-one")
    def one(store_id: str) -> str:
        reached = steps.LastStep(store_id)
        with steps.listening(reached):
            store(store_id)
        return reached.step

    @flow(name="steps-heard-batch", task_runner=ThreadPoolTaskRunner(max_workers=2))
    def batch() -> list[str]:
        return [f.result() for f in [one.submit("s1"), one.submit("s2")]]

    heard: Heard = []
    with steps.listening(recorder(heard)):
        assert batch() == ["image", "image"]
    assert sorted(heard) == [("s1", "image", "done"), ("s1", "image", "running"),
                             ("s2", "image", "done"), ("s2", "image", "running")]
    assert steps.LastStep("s3").step == "validation"  # before any step
