"""tasks.retry.retry_on: a Prefect retry_condition_fn that retries only the given exception types.

The condition is called as Prefect calls it, (task, task_run, state), with states made by
Prefect's own helpers; retry_on reads only the state (its result()), so task and task_run are
plain placeholders.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefect.states import Completed, Crashed, Failed

from tasks.cobbler import (
    CobblerRejected,
    CobblerUnavailable,
    disable_hypervisor_netboot,
)
from tasks.erp import ErpRejected, ErpUnavailable, notify_erp
from tasks.firstboot import firstboot
from tasks.pxe_install import pxe_install_hypervisor
from tasks.retry import retry_on
from tasks.salt import (
    FirstbootFailed,
    SaltCommandFailed,
    SaltError,
    SaltEventTimeout,
    SaltMinionNoResponse,
    SaltTransientError,
)
from tasks.salt_master import prepare_vm_keys, wait_for_hypervisor
from tasks.virt import VmNotRunning, create_vm, remove_vm

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
