"""Shared by the tests/unit/tasks/test_kiwi_*.py modules: the real descriptions and private copies
of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from lab.state import REPO_ROOT
from tasks.kiwi import KiwiDescriptionError, validate_description

PARAMS = {"SALT_MASTER": "10.20.0.1", "SALT_MASTER_PORT": "4506"}
SHARED_OVERLAY = Path("image_builds/overlays/salt-minion")
OVERLAY = REPO_ROOT / SHARED_OVERLAY
MINION_D = Path("root/etc/salt/minion.d")
LEAP, DEBIAN = "leap16-jeos", "lab-debian"
PROFILE = {LEAP: None, DEBIAN: "Disk"}
# the shipped description under image_builds/, the lab's own under lab/ (both root -> the overlay)
HOME = {LEAP: Path("image_builds"), DEBIAN: Path("lab/image_builds")}


def desc_dir(name: str, root: Path = REPO_ROOT) -> Path:
    """A description's directory in the repository (or in a copy from copy_tree_with_links)."""
    return root / HOME[name] / name


def copy_description(name: str, tmp_path: Path) -> Path:
    """A private copy with root/ resolved into a real directory (mutations stay local)."""
    dest = tmp_path / name
    shutil.copytree(desc_dir(name), dest, symlinks=False)
    return dest


def copy_tree_with_links(tmp_path: Path) -> Path:
    """The descriptions and the overlay copied as they sit in the repository, relative symlinks
    kept (root -> .../image_builds/overlays/salt-minion); returns the copy's root."""
    dest = tmp_path / "repo"
    for home in sorted(set(HOME.values())):
        shutil.copytree(REPO_ROOT / home, dest / home, symlinks=True)
    for name in HOME:
        root = desc_dir(name, dest) / "root"
        assert root.is_symlink() and root.resolve() == (dest / SHARED_OVERLAY).resolve(), root
    return dest


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def problems_of(desc: Path, profile: str | None) -> str:
    with pytest.raises(KiwiDescriptionError) as info:
        validate_description(desc, profile)
    assert isinstance(info.value, ValueError)
    assert str(desc) in str(info.value)
    return "\n".join(info.value.problems)


def no_version(d: Path) -> None:
    """Break a description: drop its <version> (KIWI's runtime check refuses it)."""
    text = (d / "config.xml").read_text()
    (d / "config.xml").write_text(re.sub(r"<version>.*</version>", "", text))
