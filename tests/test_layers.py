"""The import graph has arrows one way: core (store_rollout) <- tasks <- flows <- app (the CLI).

`lab/` sits beside the app: it may use every layer, and no layer imports it (the CLI gets the
`lab` sub-command through an entry point). Flows only wire: no protocol or SDK module in them.
Every import counts, also one inside a function (a lazy import is still an arrow).

What ships to store hosts and images (`salt_states/`, `image_builds/`) names no lab: the lab's
Salt behaviour lives in lab/salt_overlay/, which only the lab's master serves, and its KIWI
description in lab/image_builds/.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from lab.state import REPO_ROOT

LAYERS = {"store_rollout": 0, "tasks": 1, "flows": 2, "app": 3}
BESIDE = {"lab"}  # may import any layer; imported by none
# what a flow may not touch itself: the outside systems' protocols live in tasks/
# what ships: no word of the lab in any file there, comments included
SHIPPED = ("salt_states", "image_builds")
LAB_WORD = re.compile(r"\blab\b|store_rollout_lab", re.IGNORECASE)
FLOW_FORBIDDEN = {"xmlrpc", "libvirt", "requests", "httpx", "salt", "subprocess", "urllib3", "kiwi", "socket"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


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
    found = violations(tmp_path)
    assert len(found) == 3, found
    assert any(f.startswith("store_rollout/settings.py:") and "imports flows" in f for f in found)
    assert "tasks/sneaky.py:1 imports lab (nothing imports the lab)" in found
    assert any(f.startswith("flows/raw.py:1: a flow imports xmlrpc") for f in found)


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


def test_what_ships_names_no_lab() -> None:
    assert lab_words(REPO_ROOT) == []


def test_a_planted_lab_word_is_found(tmp_path: Path) -> None:
    for top in SHIPPED:
        shutil.copytree(REPO_ROOT / top, tmp_path / top, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert lab_words(tmp_path) == []
    sls = tmp_path / "salt_states" / "store_vm" / "config" / "init.sls"
    sls.write_text(sls.read_text() + "# in the Lab, skip this\n")
    module = tmp_path / "salt_states" / "_modules" / "provisioning.py"
    module.write_text(module.read_text().replace("import os\n", "import os  # store_rollout_lab\n"))
    script = tmp_path / "image_builds" / "leap-jeos" / "config.sh"
    script.write_text(script.read_text() + "# lab: keep\n")
    found = lab_words(tmp_path)
    assert sorted(f.split(":")[0] for f in found) == ["image_builds/leap-jeos/config.sh",
                                                       "salt_states/_modules/provisioning.py",
                                                       "salt_states/store_vm/config/init.sls"], found
