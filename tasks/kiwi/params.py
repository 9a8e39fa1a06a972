"""Build parameters: per-site values (``SALT_MASTER``, ``SALT_MASTER_PORT``) and the image's
version (``IMAGE_VERSION``, store_rollout/image_versions.py) for the overlay's
``"@KEY@"`` placeholders, plus the few the builders read themselves (``KIWI_PROFILE``,
``LAB_DISK_SIZE``). Every parameter is part of the image key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from store_rollout.contracts import IMAGE_VERSION_PARAM, UNVERSIONED_IMAGE
from tasks.kiwi.errors import BuildParamsError
from tasks.kiwi.overlay import placeholders

__all__ = [
    "BUILDER_PARAMS",
    "DEFAULT_PARAMS",
    "PARAM_KEY_RE",
    "PARAM_VALUE_RE",
    "kiwi_profile",
    "resolve_params",
]

DEFAULT_PARAMS: Mapping[str, str] = {"SALT_MASTER_PORT": "4506",
                                     IMAGE_VERSION_PARAM: UNVERSIONED_IMAGE}
"""Build parameters with a default; every other placeholder must be passed explicitly. An image
built without a version says so in its grain (``store_image_version: unversioned``)."""

BUILDER_PARAMS = frozenset({"KIWI_PROFILE", "LAB_DISK_SIZE"})
"""Parameters read by the builders themselves (part of the key, never placeholders)."""

PARAM_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
PARAM_VALUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")


def kiwi_profile(params: Mapping[str, str]) -> str | None:
    """The KIWI profile ``KIWI_PROFILE`` selects (``None``: the ``import="true"`` profiles)."""
    return params.get("KIWI_PROFILE") or None


def resolve_params(desc_dir: Path, params: Mapping[str, str]) -> dict[str, str]:
    """Defaults + ``params``, checked against the placeholders the overlay uses.

    Args:
        desc_dir: The description directory.
        params: Build parameters, e.g. ``{"SALT_MASTER": "10.20.0.1"}``.

    Returns:
        The effective parameters (sorted by key).

    Raises:
        BuildParamsError: A placeholder has no value, or a key/value is malformed.
    """
    effective = {**DEFAULT_PARAMS, **params}
    problems: list[str] = []
    for key, value in sorted(effective.items()):
        if not isinstance(key, str) or not PARAM_KEY_RE.match(key):
            problems.append(f"parameter name {key!r} must match {PARAM_KEY_RE.pattern}")
        elif not isinstance(value, str) or not PARAM_VALUE_RE.match(value):
            problems.append(f"parameter {key}={value!r} must match {PARAM_VALUE_RE.pattern}")
    for name, files in sorted(placeholders(desc_dir).items()):
        if name in BUILDER_PARAMS:
            problems.append(f"placeholder @{name}@ in {', '.join(files)} is a builder parameter")
        elif name not in effective:
            problems.append(f"no value for @{name}@ (used in minion.d/{', minion.d/'.join(files)})")
    if problems:
        raise BuildParamsError(desc_dir, problems)
    return dict(sorted(effective.items()))
