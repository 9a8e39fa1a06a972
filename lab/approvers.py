"""The lab's approvers: two names with random TOTP seeds (pyotp.random_base32), saved by `lab
up` in the Secret Block the lab's settings name (kept across restarts: an authenticator set
up once stays right). `store-rollout lab approver-code NAME` prints a code for a demo; the
tests take theirs from `approver_code`, which never hands out a code already used."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

LAB_APPROVERS = ("ana", "ben")
LAB_APPROVERS_BLOCK = "lab-approvers"


def save_approvers_block(api: str) -> None:
    """The lab approvers' seeds, made once (an existing Block is kept)."""
    import pyotp
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from pydantic import SecretStr

    with temporary_settings(updates={PREFECT_API_URL: api}):
        try:
            Secret.load(LAB_APPROVERS_BLOCK)
            return
        except ValueError:
            pass  # none yet
        seeds = {name: pyotp.random_base32() for name in LAB_APPROVERS}
        Secret(value=SecretStr(json.dumps(seeds))).save(LAB_APPROVERS_BLOCK, overwrite=True)


def seeds(api: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.approvers import approver_seeds

    with temporary_settings(updates={PREFECT_API_URL: api}):
        return approver_seeds(LAB_APPROVERS_BLOCK)


def approver_code(api: str, audit_dir: str | Path, name: str = LAB_APPROVERS[0],
                  seed_map: dict[str, str] | None = None) -> str:
    """A code of `name` that the next check accepts: not of a step already used (waits up
    to one 30-s step when the accepted ones are used)."""
    from store_rollout.approvers import last_step, next_code

    seed = (seed_map or seeds(api))[name]
    for _ in range(32):
        code = next_code(seed, last_step(Path(audit_dir), name))
        if code is not None:
            return code
        time.sleep(1)
    raise RuntimeError(f"no unused code of {name!r} within 32 s")


def code_args(lab: Any, name: str = LAB_APPROVERS[0]) -> list[str]:
    """`--approver NAME --code CODE` of a lab approver, for a test's command."""
    return ["--approver", name, "--code", approver_code(lab.prefect_api_url, audit_dir(lab), name)]


def audit_dir(lab: Any) -> Path:
    """The lab's audit trail and used codes (its flows' STORE_ROLLOUT_AUDIT_DIR)."""
    return Path(lab.state_dir) / "audit"
