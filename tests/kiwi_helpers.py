"""Shared by the tests/test_kiwi_*.py modules: the real descriptions and private copies of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tasks.kiwi import IMAGE_BUILDS_DIR, KiwiDescriptionError, validate_description

PARAMS = {"SALT_MASTER": "10.20.0.1", "SALT_MASTER_PORT": "4506"}
OVERLAY = IMAGE_BUILDS_DIR / "overlays" / "salt-minion"
MINION_D = Path("root/etc/salt/minion.d")
LEAP, DEBIAN = "leap-jeos", "lab-debian"
PROFILE = {LEAP: None, DEBIAN: "Disk"}


def copy_description(name: str, tmp_path: Path) -> Path:
    """A private copy with root/ resolved into a real directory (mutations stay local)."""
    dest = tmp_path / name
    shutil.copytree(IMAGE_BUILDS_DIR / name, dest, symlinks=False)
    return dest


def copy_tree_with_links(tmp_path: Path) -> Path:
    """image_builds/ copied with its relative symlinks kept (root -> ../overlays/...)."""
    dest = tmp_path / "image_builds"
    shutil.copytree(IMAGE_BUILDS_DIR, dest, symlinks=True)
    assert (dest / LEAP / "root").is_symlink()
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
