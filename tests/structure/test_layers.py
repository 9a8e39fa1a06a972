"""The import graph has arrows one way: core (store_rollout) <- tasks <- flows <- app (the CLI).

`lab/` sits beside the app: it may use every layer, and no layer imports it (its own
distribution registers the `lab` sub-command and image builder through entry points,
store_rollout/plugins.py). Flows only wire: no protocol or SDK module in them. Every import
counts, also one inside a function (a lazy import is still an arrow), and a module imported by
its name as a string (`importlib.import_module("x")`, `__import__("x")`).

Inside tasks/, steps stand side by side: a step module imports no other step module, a client or
a helper imports no step module, a client no other client (the three lists: tasks/__init__.py).

What ships names no lab. To store hosts and images (`salt_states/`, `image_builds/`): no word of
it, comments included; the lab's Salt behaviour lives in lab/salt_overlay/, which only the lab's
master serves, and its KIWI description in lab/image_builds/. In the Python packages: no name or
string of it (a comment or docstring may point to the lab as what exercises the code); the lab's
image builder lives in lab/image_builder.py.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import tokenize
from pathlib import Path

import tasks
from tests.helpers import REPO_ROOT

LAYERS = {"store_rollout": 0, "tasks": 1, "flows": 2, "app": 3}
BESIDE = {"lab"}  # may import any layer; imported by none
# what a flow may not touch itself: the outside systems' protocols live in tasks/
# what ships: no word of the lab in any file there, comments included
SHIPPED = ("salt_states", "image_builds")
LAB_WORD = re.compile(r"\blab\b|store_rollout_lab", re.IGNORECASE)
# the words of a Python name (LabBuilder, LAB_DISK, lab_builder: each has the word "lab")
NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# what imports a module given its name as a string: importlib.import_module("x"), __import__("x")
IMPORT_BY_NAME = {"import_module", "__import__"}
FLOW_FORBIDDEN = {"xmlrpc", "libvirt", "requests", "httpx", "salt", "subprocess", "urllib3", "kiwi", "socket"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module, nested ones included, and of every
    module imported by a string naming it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif (target := imported_by_name(node)) is not None:
            found.append((node.lineno, target.split(".")[0]))
    return found


def imported_by_name(node: ast.AST) -> str | None:
    """The module a call like `import_module("x.y")` imports: its first argument when a string
    (a relative name, `.y`, stays in the caller's package)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    first = node.args[0]
    if name in IMPORT_BY_NAME and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value if not first.value.startswith(".") else None
    return None


def violations(root: Path) -> list[str]:
    problems = []
    for package in [*LAYERS, *BESIDE]:
        for path in sorted((root / package).rglob("*.py")):
            where = path.relative_to(root)
            for line, target in imports_of(path):
                if package in LAYERS and target in BESIDE:
                    problems.append(f"{where}:{line} imports {target} (nothing imports the lab)")
                elif package in LAYERS and LAYERS.get(target, -1) > LAYERS[package]:
                    problems.append(
                        f"{where}:{line}: {package} imports {target}, a layer above it "
                        f"(arrows go {' <- '.join(LAYERS)})"
                    )
                elif package == "flows" and target in FLOW_FORBIDDEN:
                    problems.append(
                        f"{where}:{line}: a flow imports {target} (flows only wire; "
                        "the protocol belongs in tasks/)"
                    )
    return problems


def test_the_import_graph_has_arrows_one_way() -> None:
    assert violations(REPO_ROOT) == []


def test_a_planted_violation_is_found(tmp_path: Path) -> None:
    for package in [*LAYERS, *BESIDE]:
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(tmp_path) == []
    settings = tmp_path / "store_rollout" / "settings.py"
    settings.write_text(
        settings.read_text() + "\n\ndef _late() -> None:\n"
        "    from flows.rollout import store_rollout  # noqa\n"
    )
    (tmp_path / "tasks" / "sneaky.py").write_text("from lab.state import REPO_ROOT\n")
    (tmp_path / "flows" / "raw.py").write_text("import xmlrpc.client\n")
    # the same arrows taken through a module's name as a string
    (tmp_path / "app" / "by_name.py").write_text(
        "import importlib\nfrom importlib import import_module\n\n\n"
        "def hint() -> None:\n    importlib.import_module(\"lab.cli\")\n")
    (tmp_path / "tasks" / "dunder.py").write_text("x = import_module('flows.rollout')\n"
                                                  "y = __import__('lab')\n")
    (tmp_path / "flows" / "raw_by_name.py").write_text("import importlib\n\n"
                                                       "c = importlib.import_module('socket')\n")
    found = violations(tmp_path)
    assert len(found) == 7, found
    assert any(f.startswith("store_rollout/settings.py:") and "imports flows" in f for f in found)
    assert "tasks/sneaky.py:1 imports lab (nothing imports the lab)" in found
    assert any(f.startswith("flows/raw.py:1: a flow imports xmlrpc") for f in found)
    assert "app/by_name.py:6 imports lab (nothing imports the lab)" in found
    assert any(f.startswith("tasks/dunder.py:1: tasks imports flows") for f in found)
    assert "tasks/dunder.py:2 imports lab (nothing imports the lab)" in found
    assert any(f.startswith("flows/raw_by_name.py:3: a flow imports socket") for f in found)


def test_a_module_named_in_a_variable_or_relatively_is_no_arrow() -> None:
    calls = ["import_module(entry.module)", "import_module('.views', 'app')",
             "importlib.util.find_spec('lab')", "import_module()"]
    assert [imported_by_name(ast.parse(c).body[0].value) for c in calls  # type: ignore[attr-defined]
            ] == [None, None, None, None]


def task_units(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module or package right under tasks/) of every import of tasks/ in a module,
    nested and relative ones included."""
    package = list(path.relative_to(root).parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[1]) for alias in node.names
                      if alias.name.startswith("tasks.")]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            parts = base + (node.module.split(".") if node.module else [])
            if parts[:1] != ["tasks"]:
                continue
            if len(parts) > 1:
                found.append((node.lineno, parts[1]))
            else:  # from tasks import observe
                found += [(node.lineno, alias.name) for alias in node.names]
    return found


def step_problems(root: Path, steps: tuple[str, ...] = tasks.STEP_MODULES,
                  clients: tuple[str, ...] = tasks.CLIENTS,
                  helpers: tuple[str, ...] = tasks.HELPERS) -> list[str]:
    """Where a module of tasks/ leans on a step module (or a client on another client), and the
    modules of tasks/ in no list or in a list but gone."""
    kind = {**dict.fromkeys(helpers, "helper"), **dict.fromkeys(clients, "client"),
            **dict.fromkeys(steps, "step module")}
    units = {p.name.removesuffix(".py") for p in (root / "tasks").iterdir()
             if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    problems = [f"tasks/{unit}: neither a step module, a client nor a helper (say which in "
                "tasks/__init__.py)" for unit in sorted(units - set(kind))]
    problems += [f"tasks/{unit}: listed in tasks/__init__.py, not in tasks/"
                 for unit in sorted(set(kind) - units)]
    for path in sorted((root / "tasks").rglob("*.py")):
        where = path.relative_to(root)
        if where == Path("tasks/__init__.py"):
            continue
        unit = where.parts[1].removesuffix(".py")
        mine = kind.get(unit, "module")
        for line, target in task_units(path, root):
            if target == unit or target not in kind:
                continue
            if kind[target] == "step module" or mine == kind[target] == "client":
                problems.append(f"{where}:{line}: {mine} {unit} imports {kind[target]} {target} "
                                "(steps stand side by side: what both use belongs in a client "
                                "or a helper)")
    return problems


def test_no_step_module_imports_another() -> None:
    assert step_problems(REPO_ROOT) == []


def test_a_planted_step_twin_is_found(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "tasks", tmp_path / "tasks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert step_problems(tmp_path) == []
    (tmp_path / "tasks" / "twin.py").write_text(
        "from tasks.pxe_install import pxe_install_hypervisor  # noqa\n")
    windows = tmp_path / "tasks" / "windows.py"
    windows.write_text(windows.read_text() + "\n\ndef _late() -> None:\n"
                       "    from tasks import observe  # noqa\n")
    (tmp_path / "tasks" / "salt" / "sneaky.py").write_text("from .. import virt  # noqa\n")
    (tmp_path / "tasks" / "erp_twin.py").write_text("import tasks.cobbler.client  # noqa\n")
    (tmp_path / "tasks" / "stray.py").write_text("X = 1\n")
    found = step_problems(tmp_path, steps=(*tasks.STEP_MODULES, "twin"),
                          clients=(*tasks.CLIENTS, "erp_twin"))
    assert [f.split(" (")[0] for f in found] == [
        "tasks/stray: neither a step module, a client nor a helper",
        "tasks/erp_twin.py:1: client erp_twin imports client cobbler",
        "tasks/salt/sneaky.py:1: client salt imports step module virt",
        "tasks/twin.py:1: step module twin imports step module pxe_install",
        "tasks/windows.py:" + str(len(windows.read_text().splitlines()))
        + ": helper windows imports step module observe"], found


def lab_words(root: Path) -> list[str]:
    """file:line of every lab word in what ships."""
    problems = []
    for top in SHIPPED:
        files = {p.resolve(): p for p in sorted((root / top).rglob("*")) if p.is_file()}
        for path in files.values():
            where = path.relative_to(root)
            if "__pycache__" in where.parts:
                continue
            text = path.read_bytes().decode(errors="replace")
            problems += [f"{where}:{number}: {line.strip()[:80]}"
                         for number, line in enumerate(text.splitlines(), 1)
                         if LAB_WORD.search(line)]
    return problems


def lab_words_in_code(root: Path) -> list[str]:
    """file:line of every name or string (docstrings aside) with a lab word in the packages."""
    problems = []
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            docstrings = {(node.body[0].lineno, node.body[0].col_offset)
                          for node in ast.walk(ast.parse(text))
                          if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                        | ast.AsyncFunctionDef)
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)
                          and isinstance(node.body[0].value.value, str)}
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                if token.type == tokenize.NAME:
                    found = "lab" in (w.lower() for w in NAME_WORDS.findall(token.string))
                elif token.type == tokenize.STRING and token.start not in docstrings:
                    found = LAB_WORD.search(token.string) is not None
                else:
                    continue
                if found:
                    problems.append(f"{path.relative_to(root)}:{token.start[0]}: {token.string[:80]}")
    return problems


def test_what_ships_names_no_lab() -> None:
    assert lab_words(REPO_ROOT) == []
    assert lab_words_in_code(REPO_ROOT) == []


def test_a_planted_lab_word_is_found(tmp_path: Path) -> None:
    for top in SHIPPED:
        shutil.copytree(REPO_ROOT / top, tmp_path / top, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert lab_words(tmp_path) == []
    sls = tmp_path / "salt_states" / "store_vm" / "config" / "init.sls"
    sls.write_text(sls.read_text() + "# in the Lab, skip this\n")
    module = tmp_path / "salt_states" / "_modules" / "provisioning.py"
    module.write_text(module.read_text().replace("import os\n", "import os  # store_rollout_lab\n"))
    script = tmp_path / "image_builds" / "leap16-jeos" / "config.sh"
    script.write_text(script.read_text() + "# lab: keep\n")
    found = lab_words(tmp_path)
    assert sorted(f.split(":")[0] for f in found) == ["image_builds/leap16-jeos/config.sh",
                                                         "salt_states/_modules/provisioning.py",
                                                         "salt_states/store_vm/config/init.sls"], found


def test_a_planted_lab_word_in_the_packages_is_found(tmp_path: Path) -> None:
    for package in LAYERS:
        shutil.copytree(REPO_ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert lab_words_in_code(tmp_path) == []
    task = tmp_path / "tasks" / "kiwi" / "task.py"
    task.write_text(task.read_text().replace('builder: str = "kiwi"', 'builder: str = "lab"', 1))
    (tmp_path / "tasks" / "kiwi" / "halting.py").write_text(
        '"""A docstring may say: the lab."""\n\n\nclass LabBuilder:\n'
        '    """Nor here: the lab."""\n\n    # nor a comment: lab\n'
        '    tag = "lab-v2"\n    size = "LAB_DISK_SIZE"\n')
    settings = tmp_path / "store_rollout" / "settings.py"
    settings.write_text(settings.read_text() + "\n\nLAB_BUILDER = 'kiwi'\n")
    found = lab_words_in_code(tmp_path)
    line = {path: next(n for n, text in enumerate(path.read_text().splitlines(), 1) if needle in text)
            for path, needle in ((settings, "LAB_BUILDER"), (task, '"lab"'))}
    assert sorted(f.rsplit(":", 1)[0] for f in found) == [
        f"store_rollout/settings.py:{line[settings]}", "tasks/kiwi/halting.py:4",
        "tasks/kiwi/halting.py:8", f"tasks/kiwi/task.py:{line[task]}"], found
