"""tasks.retry.retry_on: a Prefect retry_condition_fn that retries only the given exception types.

The condition is called as Prefect calls it, (task, task_run, state), with states made by
Prefect's own helpers; retry_on reads only the state (its result()), so task and task_run are
plain placeholders.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from prefect.states import Completed, Crashed, Failed

from tasks.bmc import power_off_hypervisor
from tasks.cobbler import (
    CobblerRejected,
    CobblerUnavailable,
    disable_hypervisor_netboot,
    remove_hypervisor_record,
)
from tasks.erp import (
    ErpRejected,
    ErpUnavailable,
    notify_erp,
    notify_erp_decommissioned,
    notify_erp_replaced,
)
from tasks.firstboot import firstboot
from tasks.go_live import go_live_gate
from tasks.pxe_install import pxe_install_hypervisor
from tasks.retire_box import retire_old_box
from tasks.retry import (
    BMC_RETRY,
    COBBLER_RETRY,
    ERP_RETRY,
    SALT_KEYS_RETRY,
    SALT_VIRT_RETRY,
    SALT_WAIT_RETRY,
    retry_on,
)
from tasks.salt import (
    FirstbootFailed,
    SaltCommandFailed,
    SaltError,
    SaltEventTimeout,
    SaltMinionNoResponse,
    SaltTransientError,
)
from tasks.salt_master import prepare_vm_keys, remove_store_keys, wait_for_hypervisor
from tasks.store_vm import VmNotRunning
from tasks.virt import create_vm, remove_vm
from tests.helpers import REPO_ROOT
from tests.structure.test_module_size import is_task

TASK, TASK_RUN = object(), object()


def retries(condition: Any, state: Any) -> bool:
    result = condition(TASK, TASK_RUN, state)
    assert isinstance(result, bool)
    return result


def test_retries_the_given_type_and_its_subclasses() -> None:
    condition = retry_on(SaltTransientError)
    assert retries(condition, Failed(data=SaltTransientError("bus timed out")))
    assert retries(condition, Failed(data=SaltMinionNoResponse("hv", "test.ping", 5)))
    assert retries(condition, Failed(data=SaltEventTimeout("no event")))


@pytest.mark.parametrize("exc", [
    SaltError("master config missing"),  # the parent of the retried type is not retried
    SaltCommandFailed("hv", "state.apply", 1, "pkg: not found"),
    ValueError("bad minion id"),
    KeyError("uuid"),
])
def test_does_not_retry_other_types(exc: BaseException) -> None:
    assert not retries(retry_on(SaltTransientError), Failed(data=exc))


def test_several_types() -> None:
    condition = retry_on(CobblerUnavailable, ErpUnavailable)
    assert retries(condition, Failed(data=CobblerUnavailable("refused")))
    assert retries(condition, Failed(data=ErpUnavailable("503")))
    assert not retries(condition, Failed(data=ErpRejected("400")))


def test_states_without_the_exception_are_not_retried() -> None:
    condition = retry_on(RuntimeError)
    assert not retries(condition, Completed(data=42))
    assert not retries(condition, Failed(message="failed without an exception"))
    assert not retries(condition, Crashed(message="worker died"))  # not the task's own error


@pytest.mark.parametrize(("task", "retried", "not_retried"), [
    (pxe_install_hypervisor, CobblerUnavailable("refused"), CobblerRejected("bad profile")),
    (disable_hypervisor_netboot, CobblerUnavailable("refused"), CobblerRejected("bad name")),
    (notify_erp, ErpUnavailable("503"), ErpRejected("400")),
    (wait_for_hypervisor, SaltEventTimeout("late"), SaltError("no config")),
    (prepare_vm_keys, SaltMinionNoResponse("hv", "x", 1), SaltCommandFailed("hv", "x", 1, "")),
    (create_vm, SaltMinionNoResponse("hv", "x", 1), VmNotRunning("paused")),
    (remove_vm, SaltMinionNoResponse("hv", "x", 1), SaltCommandFailed("hv", "x", 1, "")),
    (firstboot, SaltEventTimeout("late"), FirstbootFailed("s", "vm", [], "highstate failed")),
], ids=lambda v: getattr(v, "name", None) or type(v).__name__)
def test_tasks_retry_only_their_transient_errors(task: Any, retried: BaseException,
                                                 not_retried: BaseException) -> None:
    assert task.retries >= 1
    assert retries(task.retry_condition_fn, Failed(data=retried))
    assert not retries(task.retry_condition_fn, Failed(data=not_retried))


# ------------------------------------ one named schedule per outside system (tasks/retry.py)

SPELLED_BY_POLICY = ("retries", "retry_delay_seconds")


def spelled_schedules(root: Path) -> list[str]:
    """`@task(...)` decorators under tasks/ that spell `retries=` or `retry_delay_seconds=`
    themselves instead of taking a policy of tasks/retry.py (`**POLICY.on(...)`)."""
    found = []
    for path in sorted((root / "tasks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and is_task(node):
                    found += [f"{path.relative_to(root)}:{decorator.lineno}: task {node.name} "
                              f"spells {kw.arg}= (take a policy of tasks/retry.py)"
                              for kw in decorator.keywords if kw.arg in SPELLED_BY_POLICY]
    return found


def test_no_task_spells_its_own_retry_schedule() -> None:
    assert spelled_schedules(REPO_ROOT) == []


def test_a_planted_spelled_schedule_is_found(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "own.py").write_text(
        "from prefect import task\nfrom tasks.retry import SALT_KEYS_RETRY\n\n\n"
        "@task(name='own', retries=2, retry_delay_seconds=[2, 5])\ndef own() -> None:\n"
        "    pass\n\n\n@task(name='policy', **SALT_KEYS_RETRY.on(ValueError))\n"
        "def policy() -> None:\n    pass\n")
    assert spelled_schedules(tmp_path) == [
        "tasks/own.py:5: task own spells retries= (take a policy of tasks/retry.py)",
        "tasks/own.py:5: task own spells retry_delay_seconds= (take a policy of tasks/retry.py)"]


# each task's schedule as it was spelled before the policies were named (the same behaviour)
SCHEDULES = {
    pxe_install_hypervisor: COBBLER_RETRY, disable_hypervisor_netboot: COBBLER_RETRY,
    remove_hypervisor_record: COBBLER_RETRY, power_off_hypervisor: BMC_RETRY,
    notify_erp: ERP_RETRY, notify_erp_decommissioned: ERP_RETRY, notify_erp_replaced: ERP_RETRY,
    wait_for_hypervisor: SALT_WAIT_RETRY, firstboot: SALT_WAIT_RETRY, go_live_gate: SALT_WAIT_RETRY,
    prepare_vm_keys: SALT_KEYS_RETRY, remove_store_keys: SALT_KEYS_RETRY,
    retire_old_box: SALT_KEYS_RETRY, create_vm: SALT_VIRT_RETRY, remove_vm: SALT_VIRT_RETRY,
}


def test_each_policy_keeps_its_schedule() -> None:
    assert (COBBLER_RETRY.retries, COBBLER_RETRY.delays) == (4, (2, 4, 8, 16))
    assert (BMC_RETRY.retries, BMC_RETRY.delays) == (2, (5, 15))
    assert (ERP_RETRY.retries, ERP_RETRY.delays) == (4, (2, 5, 15, 30))
    assert (SALT_WAIT_RETRY.retries, SALT_WAIT_RETRY.delays) == (1, (5,))
    assert (SALT_KEYS_RETRY.retries, SALT_KEYS_RETRY.delays) == (2, (2, 5))
    assert (SALT_VIRT_RETRY.retries, SALT_VIRT_RETRY.delays) == (2, (3, 10))


@pytest.mark.parametrize("task", list(SCHEDULES), ids=lambda t: t.name)
def test_each_task_retries_on_its_systems_policy(task: Any) -> None:
    policy = SCHEDULES[task]
    assert (task.retries, list(task.retry_delay_seconds)) == (policy.retries, list(policy.delays))
