"""What ships is the application without the lab: the wheel holds the four packages and, as data,
the Salt tree and the KIWI descriptions; the lab is its own distribution (lab/pyproject.toml),
whose entry points add `store-rollout lab ...`, a settings hint and the `lab` image builder
(store_rollout/plugins.py), each imported only when used."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from lab.image_builder import LabBuilder
from store_rollout import plugins
from tasks.kiwi import KiwiBuilder, make_builder
from tests.helpers import REPO_ROOT

PACKAGES = ("store_rollout", "tasks", "flows", "app")
DATA = ("salt_states", "image_builds")
UNSHIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def shipped_files(root: Path) -> set[str]:
    """What the wheel should hold: every module of the packages, every file of the data trees
    (through the description's `root` symlink, as a wheel has no links)."""
    files = set()
    for top in (*PACKAGES, *DATA):
        for folder, dirs, names in os.walk(root / top, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files |= {str((Path(folder) / name).relative_to(root)) for name in names
                      if top in DATA or name.endswith(".py")}
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The application's wheel, built as pip builds it (in an isolated build environment) from
    a copy of the checkout, the lab included, so nothing is left in the checkout."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    shutil.copy2(REPO_ROOT / "pyproject.toml", src)
    for top in (*PACKAGES, *DATA, "lab"):
        shutil.copytree(REPO_ROOT / top, src / top, symlinks=True, ignore=UNSHIPPED)
    (src / "salt_states" / "_modules" / "__pycache__").mkdir()  # as a test run leaves one
    (src / "salt_states" / "_modules" / "__pycache__" / "storehost.cpython-311.pyc").write_bytes(b"")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                    str(src)], check=True, timeout=600)
    (built,) = dist.glob("store_rollout-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_the_packages_and_the_salt_tree_and_no_lab(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[0] for n in names - info} == {*PACKAGES, *DATA}
    assert names - info == shipped_files(REPO_ROOT)
    assert not [n for n in names if n.startswith("lab/") or n.endswith(".pyc")]
    entry_points = next(n for n in info if n.endswith("/entry_points.txt"))
    assert wheel.read(entry_points).decode().split() == ["[console_scripts]",
                                                         "store-rollout", "=", "app.cli:main"]
    # the description's overlay and the image's scripts, executable as in the checkout
    script = "image_builds/leap16-jeos/root/usr/local/sbin/store-identity"
    assert wheel.getinfo(script).external_attr >> 16 & 0o111


def test_the_lab_distribution_registers_what_the_application_looks_for() -> None:
    project = tomllib.loads((REPO_ROOT / "lab" / "pyproject.toml").read_text())["project"]
    groups = project["entry-points"]
    assert set(groups) == {plugins.COMMANDS, plugins.SETTINGS_HINTS, plugins.IMAGE_BUILDERS}
    for group in groups.values():
        for value in group.values():
            module, attr = value.split(":")
            assert callable(getattr(importlib.import_module(module), attr)), value
    assert "lab" not in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"].get(
        "entry-points", {}).get(plugins.COMMANDS, {})


LAB_MODULES = "json.dumps(sorted(m for m in sys.modules if m == 'lab' or m.startswith('lab.')))"


def cli(*argv: str) -> tuple[str, list[str]]:
    """The CLI's output for `argv` and the lab modules its process imported."""
    code = (f"import json, sys\nsys.argv = ['store-rollout', *{list(argv)!r}]\nfrom app.cli import main\n"
            f"try:\n    main()\nexcept SystemExit:\n    pass\nprint({LAB_MODULES}, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True, cwd=REPO_ROOT / "examples")
    return proc.stdout, json.loads(proc.stderr.splitlines()[-1])


def test_help_lists_the_lab_and_imports_none_of_it() -> None:
    assert plugins.registered(plugins.COMMANDS).keys() == {"lab"}  # `make setup` installed it
    out, imported = cli("--help")
    assert imported == []
    assert any(line.split()[1:3] == ["lab", "The"] for line in out.splitlines()
               if len(line.split()) > 2), out
    out, imported = cli("lab", "--help")
    assert "lab.cli" in imported and "approver-code" in out


def test_the_lab_builder_is_registered_and_kiwi_is_the_default(tmp_path: Path) -> None:
    assert plugins.image_builders() == ("kiwi", "lab")
    assert isinstance(make_builder("lab", tmp_path), LabBuilder)
    kiwi = make_builder("kiwi", tmp_path)
    assert isinstance(kiwi, KiwiBuilder) and kiwi.shared_cache_dir == tmp_path / "_kiwi-shared-cache"
    with pytest.raises(ValueError, match="unknown builder 'docker'; expected one of kiwi, lab"):
        make_builder("docker", tmp_path)
    from tasks.kiwi import ensure_image, image_status

    for task in (ensure_image.fn, image_status):
        assert task.__defaults__ == ("kiwi",), task
