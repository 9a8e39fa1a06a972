"""The lab's approvers: two names with random TOTP seeds (pyotp.random_base32), saved by `lab
up` in the Secret Block the lab's settings name (kept across restarts: an authenticator set
up once stays right). `store-rollout lab approver-code NAME` prints a code for a demo; the
tests take theirs from `approver_code`, which never hands out a code already used."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # lab.state imports this module for LAB_APPROVERS_BLOCK
    from lab.prefect_access import PrefectAccess
    from lab.state import LabInfo

LAB_APPROVERS = ("ana", "ben")
LAB_APPROVERS_BLOCK = "lab-approvers"


def save_approvers_block(access: PrefectAccess) -> None:
    """The lab approvers' seeds, made once (an existing Block is kept)."""
    import pyotp
    from prefect.blocks.system import Secret
    from pydantic import SecretStr

    with access.settings():
        try:
            Secret.load(LAB_APPROVERS_BLOCK)
            return
        except ValueError:
            pass  # none yet
        seeds = {name: pyotp.random_base32() for name in LAB_APPROVERS}
        Secret(value=SecretStr(json.dumps(seeds))).save(LAB_APPROVERS_BLOCK, overwrite=True)


def seeds(lab: LabInfo) -> dict[str, str]:
    from lab.prefect_access import PrefectAccess
    from tasks.approvers import approver_seeds

    with PrefectAccess.of(lab).settings():
        return approver_seeds(LAB_APPROVERS_BLOCK)


def approver_code(lab: LabInfo, name: str = LAB_APPROVERS[0],
                  seed_map: dict[str, str] | None = None) -> str:
    """A code of `name` that the next check accepts: not of a step already used (waits up
    to one 30-s step when the accepted ones are used)."""
    from store_rollout.approvers import last_step, next_code

    seed = (seed_map or seeds(lab))[name]
    for _ in range(32):
        code = next_code(seed, last_step(audit_dir(lab), name))
        if code is not None:
            return code
        time.sleep(1)
    raise RuntimeError(f"no unused code of {name!r} within 32 s")


def code_args(lab: LabInfo, name: str = LAB_APPROVERS[0]) -> list[str]:
    """`--approver NAME --code CODE` of a lab approver, for a test's command."""
    return ["--approver", name, "--code", approver_code(lab, name)]


def audit_dir(lab: LabInfo) -> Path:
    """The lab's audit trail and used codes (its flows' STORE_ROLLOUT_AUDIT_DIR)."""
    return Path(lab.state_dir) / "audit"
