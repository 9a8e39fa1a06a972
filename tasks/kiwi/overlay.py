"""The ``root/`` overlay's contract: the files the pipeline relies on and the ``minion.d`` rules.

Every description's ``root`` is a symlink to ``image_builds/overlays/salt-minion``. Its
``minion.d/*.conf`` may hold ``"@KEY@"`` placeholders (build parameters); in a real build
``config.sh`` runs ``apply-build-params`` on them inside the image, :func:`substitute` is the
same substitution in Python. :func:`overlay_problems` checks what KIWI does not: the identity
script and unit, and that the merged ``minion.d`` points at a master, autosigns on the token
grain and runs the firstboot state once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from store_rollout import contracts

__all__ = [
    "APPLY_PARAMS_SCRIPT",
    "AUTOSIGN_GRAIN",
    "BOOTSTRAP_CONF",
    "BUILD_PARAMS_FILE",
    "FIRSTBOOT_SLS",
    "IDENTITY_SCRIPT",
    "IDENTITY_UNIT",
    "MINION_D",
    "MINION_LOCK",
    "MINION_WHEELHOUSE",
    "PLACEHOLDER_RE",
    "REQUIRED_PACKAGES",
    "minion_d_dir",
    "overlay_problems",
    "placeholders",
    "substitute",
]

MINION_D = Path("etc/salt") / contracts.MINION_CONF_DIR
BUILD_PARAMS_FILE = Path("etc/store-rollout/build-params")
"""Inside the ``root/`` overlay: KEY=value lines that ``config.sh`` applies, then removes."""
MINION_LOCK = "minion-requirements.lock"
"""In a description without a distribution salt-minion (Debian 12's): the pinned Salt that
``config.sh`` installs into ``/opt/salt``."""
MINION_WHEELHOUSE = Path("usr/local/share/store-rollout/wheelhouse")
"""Inside the ``root/`` overlay: the wheels of ``MINION_LOCK`` (and the lock), which
``config.sh`` installs offline, then removes."""
IDENTITY_SCRIPT = Path("usr/local/sbin/store-identity")
IDENTITY_UNIT = Path("etc/systemd/system/store-identity.service")
APPLY_PARAMS_SCRIPT = Path("usr/local/libexec/store-rollout/apply-build-params")
BOOTSTRAP_CONF = contracts.BOOTSTRAP_CONF
FIRSTBOOT_SLS = contracts.FIRSTBOOT_SLS
AUTOSIGN_GRAIN = contracts.AUTOSIGN_GRAIN
REQUIRED_PACKAGES = ("util-linux",)
"""Packages the overlay's identity mechanism needs in every image."""

PLACEHOLDER_RE = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def substitute(text: str, values: Mapping[str, str]) -> str:
    """The substitution ``apply-build-params`` does (bash ``$(<file)`` + ``printf '%s\\n'``)."""
    out = PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    return out.rstrip("\n") + "\n"


def minion_d_dir(desc_dir: Path) -> Path:
    """``<desc>/root/etc/salt/minion.d`` (through the overlay symlink)."""
    return desc_dir / "root" / MINION_D


def placeholders(desc_dir: Path) -> dict[str, list[str]]:
    """Placeholder name -> minion.d files that use it."""
    found: dict[str, list[str]] = {}
    minion_d = minion_d_dir(desc_dir)
    if minion_d.is_dir():
        for conf in sorted(minion_d.glob("*.conf")):
            for name in PLACEHOLDER_RE.findall(conf.read_text(encoding="utf-8")):
                found.setdefault(name, []).append(conf.name)
    return found


def _merge(dest: dict[str, Any], upd: Mapping[str, Any]) -> None:
    """Salt's include merge (salt.utils.dictupdate.update, recursive, lists merged)."""
    for key, value in upd.items():
        if isinstance(value, Mapping) and isinstance(dest.get(key), dict):
            _merge(dest[key], value)
        elif isinstance(value, list) and isinstance(dest.get(key), list):
            dest[key] = dest[key] + [v for v in value if v not in dest[key]]
        else:
            dest[key] = value


def overlay_problems(desc_dir: Path, values: Mapping[str, str]) -> list[str]:
    """One line per broken rule of the contract; ``values`` fill placeholders for the YAML check."""
    root = desc_dir / "root"
    if not root.is_dir():
        return [f"{root}: missing root/ overlay (expected a symlink to ../overlays/salt-minion)"]
    problems: list[str] = []
    for rel, what in (
        (IDENTITY_SCRIPT, "store-identity boot script"),
        (APPLY_PARAMS_SCRIPT, "build parameter helper"),
    ):
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing {what}")
        elif not os.access(path, os.X_OK):
            problems.append(f"{path}: {what} not executable (mode must be 0755)")
    unit = root / IDENTITY_UNIT
    if not unit.is_file():
        problems.append(f"{unit}: missing store-identity.service unit")
    elif "Before=salt-minion.service" not in unit.read_text(encoding="utf-8"):
        problems.append(f"{unit}: [Unit] must order Before=salt-minion.service")

    minion_d = root / MINION_D
    confs = sorted(minion_d.glob("*.conf")) if minion_d.is_dir() else []
    if not confs:
        return [*problems, f"{minion_d}: no *.conf files"]
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for conf in confs:
        raw = conf.read_text(encoding="utf-8")
        docs: list[tuple[str, str]] = [("", raw)]
        if PLACEHOLDER_RE.search(raw):
            docs.append((" after placeholder substitution", substitute(raw, values)))
        data: Any = None
        for label, text in docs:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                hint = ' (quote placeholders: key: "@KEY@")' if "@" in text else ""
                detail = " ".join(str(exc).split())
                problems.append(f"{conf}: not valid YAML{label}{hint}: {detail}")
                data = None
                break
        if data is None:
            continue
        if not isinstance(data, dict):
            problems.append(f"{conf}: top level must be a mapping, got {type(data).__name__}")
            continue
        for key in data:
            origin[key] = conf.name
        _merge(merged, data)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            problems.append(f"{minion_d}: {msg}")

    master = merged.get("master")
    need(isinstance(master, str) and bool(master), "no file sets 'master' (the Salt master)")
    grains = merged.get("grains")
    need(
        isinstance(grains, dict) and isinstance(grains.get("role"), str),
        "no file sets 'grains: {role: ...}'",
    )
    autosign = merged.get("autosign_grains")
    need(
        isinstance(autosign, list) and AUTOSIGN_GRAIN in autosign,
        f"'autosign_grains' must list {AUTOSIGN_GRAIN} (written by store-identity.service)",
    )
    need(
        merged.get("startup_states") == "sls",
        f"'startup_states: sls' missing (got {merged.get('startup_states')!r})",
    )
    sls_list = merged.get("sls_list")
    need(
        isinstance(sls_list, list) and FIRSTBOOT_SLS in sls_list,
        f"'sls_list' must contain {FIRSTBOOT_SLS} (got {sls_list!r})",
    )
    for key in ("startup_states", "sls_list"):
        if key in origin and origin[key] != BOOTSTRAP_CONF:
            problems.append(
                f"{minion_d / origin[key]}: '{key}' must live in {BOOTSTRAP_CONF} "
                f"(the file {FIRSTBOOT_SLS} removes when it is done)"
            )
    return problems
