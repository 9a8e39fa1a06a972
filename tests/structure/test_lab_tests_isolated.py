"""The lab tests' stores do not meet: a lab keeps every store a test rolled out (its Cobbler
system, keys, domain, ERP notices) until the session ends, and tests share a worker's lab in any
order, so two tests rolling out one store id, or hosts of one MAC, would see each other's
leftovers. Read from the tests' sources: every `write_inventory(path, ids, mac_prefix)` call."""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.helpers import REPO_ROOT, write_inventory

TESTS = REPO_ROOT / "tests"
DEFAULT_MAC_PREFIX = write_inventory.__defaults__[0]  # type: ignore[index]
# tests whose inventory the CLI refuses before anything reaches the lab (a store not in it, an
# invalid MAC): their ids and MACs never become a Cobbler system, key or domain
REFUSED_BEFORE_ROLLOUT = {
    "tests/lab/test_rollout_e2e.py::test_bad_input_exits_nonzero_and_changes_nothing"}


class Call:
    def __init__(self, where: str, ids: list[str], mac: str, mac_is_exact: bool) -> None:
        self.where, self.ids, self.mac, self.mac_is_exact = where, ids, mac, mac_is_exact


def _strings(node: ast.AST, names: dict[str, ast.AST]) -> list[str]:
    """The string constants `node` stands for (a literal, a list or tuple of them, or a name
    assigned one in the same function); an f-string or a computed value gives none."""
    if isinstance(node, ast.Name) and node.id in names:
        return _strings(names[node.id], names)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        return [s for element in node.elts for s in _strings(element, names)]
    return []


def _assigned(function: ast.AST) -> dict[str, ast.AST]:
    """name -> value for `x = v` and `a, b = v1, v2` in the function."""
    names: dict[str, ast.AST] = {}
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                names[target.id] = node.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for name, value in zip(target.elts, node.value.elts, strict=False):
                    if isinstance(name, ast.Name):
                        names[name.id] = value
    return names


def _mac(node: ast.AST | None, names: dict[str, ast.AST]) -> tuple[str, bool]:
    """(the prefix, or the constant start of an f-string one; whether that is all of it)."""
    if node is None:
        return DEFAULT_MAC_PREFIX, True
    if isinstance(node, ast.JoinedStr):
        start = node.values[0] if node.values else None
        text = start.value if isinstance(start, ast.Constant) else ""
        return str(text), False
    found = _strings(node, names)
    return (found[0], True) if found else ("", False)


def inventory_calls(source: str, filename: str) -> list[Call]:
    calls = []
    tree = ast.parse(source)
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        names = _assigned(function)
        for node in ast.walk(function):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "write_inventory" and len(node.args) >= 2):
                mac, exact = _mac(node.args[2] if len(node.args) > 2 else None, names)
                calls.append(Call(f"{filename}::{function.name}", _strings(node.args[1], names),
                                  mac, exact))
    return calls


def clashes(calls: list[Call]) -> list[str]:
    """Store ids or MAC prefixes that two different tests use."""
    users: dict[str, set[str]] = defaultdict(set)
    for call in calls:
        for store_id in call.ids:
            users[store_id].add(call.where)
    found = [f"store id {sid!r} in {sorted(where)}" for sid, where in users.items() if len(where) > 1]
    for i, one in enumerate(calls):
        for other in calls[i + 1:]:
            if one.where == other.where or not one.mac or not other.mac:
                continue
            same = (one.mac == other.mac if one.mac_is_exact and other.mac_is_exact
                    else one.mac.startswith(other.mac) or other.mac.startswith(one.mac))
            if same:
                found.append(f"MAC prefix {one.mac!r} in {one.where} and {other.mac!r} in "
                             f"{other.where}")
    return found


def test_no_two_lab_tests_share_a_store_id_or_a_mac_prefix() -> None:
    calls = [call for path in sorted(TESTS.rglob("test_*.py"))
             for call in inventory_calls(path.read_text(), path.relative_to(REPO_ROOT).as_posix())
             if call.where not in REFUSED_BEFORE_ROLLOUT]
    assert len(calls) > 20 and sum(len(c.ids) for c in calls) > 20, "the reader lost the calls"
    assert clashes(calls) == []


def test_a_shared_store_id_or_mac_is_found() -> None:
    source = '''
def test_a(tmp_path):
    write_inventory(tmp_path / "i.yaml", ["s-one"], "52:54:00:aa:00")
def test_b(tmp_path):
    store = "s-one"
    write_inventory(tmp_path / "i.yaml", [store], "52:54:00:ab:00")
def test_c(tmp_path):
    write_inventory(tmp_path / "i.yaml", ["s-three"], f"52:54:00:ab:{n}")
def test_d(tmp_path):
    write_inventory(tmp_path / "i.yaml", ["s-four"])
def test_e(tmp_path):
    write_inventory(tmp_path / "i.yaml", ["s-five"])
'''
    assert clashes(inventory_calls(source, "t.py")) == [
        "store id 's-one' in ['t.py::test_a', 't.py::test_b']",
        "MAC prefix '52:54:00:ab:00' in t.py::test_b and '52:54:00:ab:' in t.py::test_c",
        f"MAC prefix {DEFAULT_MAC_PREFIX!r} in t.py::test_d and {DEFAULT_MAC_PREFIX!r} in "
        "t.py::test_e"]
