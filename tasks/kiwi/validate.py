"""Finding an image description and checking it the way ``kiwi-ng system build`` would.

:func:`validate_description` runs KIWI's own checks (:mod:`tasks.kiwi.inprocess`) plus what
KIWI does not check: ``bash -n`` on ``config.sh`` and the overlay scripts, the packages the
overlay needs, and the ``minion.d`` contract (:mod:`tasks.kiwi.overlay`). Every failure is
collected into one :class:`KiwiDescriptionError`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from store_rollout import contracts
from tasks.kiwi.errors import KiwiDescriptionError
from tasks.kiwi.inprocess import kiwi_problems
from tasks.kiwi.models import DescriptionInfo
from tasks.kiwi.overlay import REQUIRED_PACKAGES, overlay_problems, placeholders
from tasks.kiwi.params import DEFAULT_PARAMS

__all__ = [
    "IMAGE_BUILDS_DIR",
    "SAMPLE_VALUE",
    "VALIDATE_BASH_TIMEOUT",
    "resolve_description",
    "validate_description",
]

IMAGE_BUILDS_DIR = Path(__file__).resolve().parents[2] / "image_builds"
"""Where the image descriptions live (``image_builds/<name>/config.xml``)."""

VALIDATE_BASH_TIMEOUT = 30.0
SAMPLE_VALUE = "placeholder.invalid"
"""Stand-in for a placeholder without a value when only the description is checked."""


def resolve_description(description: str | Path) -> Path:
    """Map a description name (``leap16-jeos``) or a path to its directory.

    Raises:
        KiwiDescriptionError: Neither ``image_builds/<name>`` nor the path has a config.xml.
    """
    candidate = Path(description)
    if not (candidate / "config.xml").is_file():
        candidate = IMAGE_BUILDS_DIR / str(description)
    if not (candidate / "config.xml").is_file():
        raise KiwiDescriptionError(
            candidate, [f"{candidate / 'config.xml'}: no such image description"]
        )
    return candidate


def _bash_syntax(script: Path) -> str | None:
    proc = subprocess.run(
        ["bash", "-n", str(script)],
        capture_output=True,
        text=True,
        timeout=VALIDATE_BASH_TIMEOUT,
        check=False,
    )
    if proc.returncode == 0:
        return None
    return " ".join(proc.stderr.split()) or f"bash -n exited {proc.returncode}"


def _is_shell_script(path: Path) -> bool:
    with path.open("rb") as fh:
        first = fh.readline(200)
    return first.startswith(b"#!") and (b"bash" in first or b"/sh" in first)


def _script_problems(desc_dir: Path) -> list[str]:
    problems: list[str] = []
    config_sh = desc_dir / "config.sh"
    if not config_sh.is_file():
        return [f"{config_sh}: missing (the pipeline relies on it to apply build parameters)"]
    if not os.access(config_sh, os.X_OK):
        problems.append(f"{config_sh}: not executable (mode must be 0755)")
    if err := _bash_syntax(config_sh):
        problems.append(f"{config_sh}: bash -n: {err}")
    root = desc_dir / "root"
    if root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            if _is_shell_script(path) and (err := _bash_syntax(path)):
                problems.append(f"{path}: bash -n: {err}")
    return problems


def validate_description(
    desc_dir: Path,
    profile: str | None = None,
    *,
    params: Mapping[str, str] | None = None,
    temp_dir: Path | None = None,
) -> DescriptionInfo:
    """Check a description the way ``kiwi-ng system build`` would, plus the overlay.

    Args:
        desc_dir: Directory with ``config.xml``, ``config.sh`` and ``root/``.
        profile: KIWI profile to select (``None``: the ``import="true"`` profiles).
        params: Build parameters for the YAML check; missing placeholders get a sample value.
        temp_dir: Where KIWI may write its temp files (default: a private temp dir).

    Returns:
        Name, version, image type, format and packages as KIWI sees them.

    Raises:
        KiwiDescriptionError: With one entry per problem found.

    Example:
        >>> validate_description(IMAGE_BUILDS_DIR / "leap16-jeos", None).format
        'qcow2'
    """
    desc_dir = Path(desc_dir)
    config_xml = desc_dir / "config.xml"
    if not config_xml.is_file():
        raise KiwiDescriptionError(desc_dir, [f"{config_xml}: missing"])
    values = {name: SAMPLE_VALUE for name in placeholders(desc_dir)}
    values.update({**DEFAULT_PARAMS, **(params or {})})
    problems, info = kiwi_problems(config_xml, profile, temp_dir)
    if info is not None:
        missing = [p for p in REQUIRED_PACKAGES if p not in info.packages]
        if missing:
            problems.append(
                f'{config_xml}: <packages type="image"> lacks {", ".join(missing)} '
                f"(store-identity.service finds and mounts the {contracts.SEED_LABEL} seed disk "
                "with blkid and mount)"
            )
    problems += _script_problems(desc_dir)
    problems += overlay_problems(desc_dir, values)
    if problems or info is None:
        raise KiwiDescriptionError(desc_dir, problems)
    return info
