"""Size limits that keep the house readable: no app module over 300 lines, no Prefect task over
25 statements (a task logs, makes one call to a client or watcher, and returns; the logic it
calls lives in that client, where a unit test reaches it without Prefect), and no function in
`flows/` over 25 statements (a flow wires tasks; what it decides lives in core or tasks)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

APP_PACKAGES = ("store_rollout", "tasks", "flows", "app")
MAX_MODULE_LINES = 300
MAX_TASK_STATEMENTS = 25
MAX_FLOW_STATEMENTS = 25


def long_modules(root: Path) -> list[str]:
    found = []
    for package in APP_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines (at most "
                             f"{MAX_MODULE_LINES}: split it by job)")
    return found


def is_task(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with Prefect's `task` (bare, called, or as `prefect.task`)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "task":
            return True
    return False


def statements(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The statements in a function's body, those of functions defined inside it included."""
    return sum(isinstance(inner, ast.stmt) for inner in ast.walk(function)) - 1


def long_tasks(root: Path) -> list[str]:
    found = []
    for package in APP_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and is_task(node):
                    count = statements(node)
                    if count > MAX_TASK_STATEMENTS:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: task {node.name} "
                                     f"has {count} statements (at most {MAX_TASK_STATEMENTS})")
    return found


def long_flow_functions(root: Path) -> list[str]:
    """Functions in flows/ (flows, their hooks and helpers) over MAX_FLOW_STATEMENTS."""
    found = []
    for path in sorted((root / "flows").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = statements(node)
                if count > MAX_FLOW_STATEMENTS:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.name} has "
                                 f"{count} statements (at most {MAX_FLOW_STATEMENTS}: a flow "
                                 "wires; move what it decides into core or tasks)")
    return found


def test_no_module_over_the_limit() -> None:
    assert long_modules(REPO_ROOT) == []


def test_no_task_over_the_limit() -> None:
    assert long_tasks(REPO_ROOT) == []


def test_no_flow_function_over_the_limit() -> None:
    assert long_flow_functions(REPO_ROOT) == []


def test_a_planted_long_flow_function_is_found(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FLOW_STATEMENTS))
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "big.py").write_text(
        "from prefect import flow\n\n\n@flow\ndef big() -> None:\n" + body + "\n"
        "    def inner() -> None:\n        pass\n\n\ndef small() -> int:\n    return 1\n")
    assert long_flow_functions(tmp_path) == [
        f"flows/big.py:5: big has {MAX_FLOW_STATEMENTS + 2} statements (at most "
        f"{MAX_FLOW_STATEMENTS}: a flow wires; move what it decides into core or tasks)"]


def test_planted_long_module_and_long_task_are_found(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_TASK_STATEMENTS + 1))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "big.py").write_text(
        "from prefect import task\n\n\n@task(name='big')\ndef big() -> None:\n" + body + "\n"
        + "\n" * MAX_MODULE_LINES)
    (tmp_path / "tasks" / "small.py").write_text(
        "import prefect\n\n\n@prefect.task\ndef small() -> int:\n    return 1\n")
    assert long_modules(tmp_path) == [
        f"tasks/big.py: {MAX_MODULE_LINES + MAX_TASK_STATEMENTS + 6} lines (at most "
        f"{MAX_MODULE_LINES}: split it by job)"]
    assert long_tasks(tmp_path) == [
        f"tasks/big.py:5: task big has {MAX_TASK_STATEMENTS + 1} statements (at most "
        f"{MAX_TASK_STATEMENTS})"]
