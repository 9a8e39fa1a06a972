"""tasks.salt's public surface is what `__all__` says, and the steps built on it stay thin.

As httpx pins its exports (its test_all_imports_are_exported): every public name in the
package's namespace is in `__all__`, sorted, and nothing else is, so importers never come to
rely on a name that is there by accident (a submodule's helper imported for internal use).
"""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import tasks.salt
from tasks.firstboot import firstboot
from tasks.salt_master import wait_for_hypervisor


def test_the_exported_names_are_exactly_all() -> None:
    public = [name for name, value in vars(tasks.salt).items()
              if not name.startswith("_") and not isinstance(value, ModuleType)]
    assert tasks.salt.__all__ == sorted(public, key=str.casefold)


def statements(fn: object) -> int:
    """Every ast.stmt inside the function, nested ones included (the issue's count)."""
    tree = ast.parse(inspect.getsource(inspect.unwrap(fn)))
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    return sum(isinstance(node, ast.stmt) for stmt in body.body for node in ast.walk(stmt))


def test_the_waiting_steps_are_thin() -> None:
    for task in (wait_for_hypervisor, firstboot):
        assert statements(task.fn) <= 25, task.name
