"""tasks.salt's public surface is what `__all__` says, and the steps built on it stay thin.

As httpx pins its exports: a name added to or dropped from the package's namespace without
`__all__` (and this list) changing fails here, so importers never come to rely on an accident.
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import tasks.salt
from tasks.firstboot import firstboot
from tasks.salt_master import wait_for_hypervisor

EXPORTED = [
    "FirstbootFailed",
    "FirstbootWatcher",
    "hypervisor_ready",
    "HypervisorKeyContested",
    "HypervisorMinionRefused",
    "HypervisorReadyWatcher",
    "key_state_in",
    "master_client",
    "prepare_salt_runtime",
    "SaltCommandFailed",
    "SaltError",
    "SaltEvent",
    "SaltEventTimeout",
    "SaltMasterClient",
    "SaltMasterUnavailable",
    "SaltMinionNoResponse",
    "SaltTransientError",
    "VmNeverContacted",
]


def test_the_exported_names_are_exactly_all() -> None:
    assert tasks.salt.__all__ == EXPORTED
    assert tasks.salt.__all__ == sorted(tasks.salt.__all__, key=str.casefold)
    public = [name for name, value in vars(tasks.salt).items()
              if not name.startswith("_") and not isinstance(value, ModuleType)]
    assert sorted(public, key=str.casefold) == EXPORTED


def statements(fn: object) -> int:
    """Every ast.stmt inside the function, nested ones included (the issue's count)."""
    tree = ast.parse(inspect.getsource(inspect.unwrap(fn)))  # type: ignore[arg-type]
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    return sum(isinstance(node, ast.stmt) for stmt in body.body for node in ast.walk(stmt))


def test_the_waiting_steps_are_thin() -> None:
    for task in (wait_for_hypervisor, firstboot):
        assert statements(task.fn) <= 25, task.name
