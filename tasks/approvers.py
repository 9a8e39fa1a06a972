"""Proving an approver (store_rollout/approvers.py) against the seeds in the Prefect Secret
Block the `approvers_block` setting names: a JSON map name -> base32 seed. Seeds are never
logged; a missing or malformed Block is an ApproverError saying how to set it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from store_rollout.approvers import ApproverError, Proven, verify
from tasks.blocks import secret_text


def approver_seeds(block_name: str) -> dict[str, str]:
    """name -> seed, from the Secret Block `block_name`."""
    value = secret_text(block_name)
    if value is None:
        raise ApproverError(f"no approvers: no Secret Block {block_name!r} (setting "
                            "approvers_block): save one holding a JSON map of approver "
                            "name to base32 TOTP seed")
    try:
        seeds = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        seeds = None
    if not isinstance(seeds, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in seeds.items()):
        raise ApproverError(f"Secret Block {block_name!r} (setting approvers_block) is not a "
                            "JSON map of approver name to base32 seed: fix it in the Prefect UI")
    return seeds


def prove(settings: Any, name: str, code: str, *, consume: bool = True) -> Proven:
    """The approver `name` proven by `code` (used up unless `consume` is False), else
    ApproverError naming what was wrong."""
    name = name.strip()
    if not name:  # before any read: nobody named is nobody proven
        raise ApproverError("no approver named: give your approver name and a one-time code "
                            "of your authenticator")
    return verify(approver_seeds(settings.approvers_block), name, code,
                  Path(settings.audit_dir), consume=consume)
