"""Named approvers, proven by one-time codes (TOTP, RFC 6238, with pyotp): an approval, a
rejection or a `--yes` counts only for a person whose authenticator made the code given.

Each approver has a base32 seed (the seeds live in a Prefect Secret Block, tasks/approvers.py
loads them; the setting `approvers_block` names it, never holds one). A code is good in its
30-s step and one step either side (pyotp's valid_window=1: clocks drift), and once only: the
last step used per approver is kept in `approver-codes.jsonl` of the audit directory (0600,
appended under an exclusive lock), and a code of that step or an earlier one is refused, so a
code seen over a shoulder or in a run's parameters cannot be used again.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pyotp

from store_rollout.audit import append_line, ensure_dir

CODES_FILE: Final = "approver-codes.jsonl"
VALID_WINDOW: Final = 1  # steps either side of now a code may be from (clock drift)


class ApproverError(ValueError):
    """An approver who is not one, or a code that does not prove them: nothing counts."""


@dataclass(frozen=True)
class Proven:
    """A person whose one-time code was checked: their name and the code's time step."""

    name: str
    step: int
    at: datetime


def step_of(totp: pyotp.TOTP, when: datetime) -> int:
    return int(totp.timecode(when))


def matching_step(seed: str, code: str, now: datetime) -> int | None:
    """The time step (now ± VALID_WINDOW) whose code `code` is, else None."""
    totp = pyotp.TOTP(seed)
    current = step_of(totp, now)
    for step in range(current - VALID_WINDOW, current + VALID_WINDOW + 1):
        if hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


def _seed_of(seeds: dict[str, str], name: str) -> str:
    if not name:
        raise ApproverError("no approver named: give your approver name and a one-time code of "
                            "your authenticator")
    seed = seeds.get(name)
    if not seed:
        raise ApproverError(f"approver {name!r} unknown: use a name of the approvers Secret "
                            "Block (setting approvers_block), or ask an admin to add you")
    return seed


def _last_steps(handle: int) -> dict[str, int]:
    os.lseek(handle, 0, os.SEEK_SET)
    last: dict[str, int] = {}
    with os.fdopen(os.dup(handle), encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                entry = json.loads(line)
                last[entry["approver"]] = max(last.get(entry["approver"], -1), entry["step"])
    return last


def verify(seeds: dict[str, str], name: str, code: str, state_dir: Path, *,
           consume: bool = True, now: datetime | None = None) -> Proven:
    """`name` proven by `code`, else ApproverError saying what was wrong. `consume`: the code is
    used up (its step recorded); False only checks it (a command before it starts the run
    that verifies it again and uses it)."""
    now = now or datetime.now(UTC)
    seed = _seed_of(seeds, name)
    code = code.strip().replace(" ", "")
    step = matching_step(seed, code, now) if code.isdigit() else None
    if step is None:
        raise ApproverError(f"code wrong for {name!r} (or expired): type the code your "
                            "authenticator shows now")
    ensure_dir(state_dir)
    path = state_dir / CODES_FILE
    handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one verifier at a time reads, then appends
        if _last_steps(handle).get(name, -1) >= step:
            raise ApproverError(f"code wrong for {name!r}: this code (or a later one) was used "
                                "already; wait for your authenticator's next code")
        if consume:
            append_line(handle, {"approver": name, "step": step, "at": now.isoformat()})
    finally:
        os.close(handle)  # releases the lock
    return Proven(name=name, step=step, at=now)


def next_code(seed: str, last_step: int, now: datetime | None = None) -> str | None:
    """The code of the earliest step still accepted after `last_step` (the lab's demo and
    tests); None when every accepted step is used: wait for the next one."""
    totp = pyotp.TOTP(seed)
    current = step_of(totp, now or datetime.now(UTC))
    for step in range(current, current + VALID_WINDOW + 1):  # not the past: it may expire
        if step > last_step:
            return totp.generate_otp(step)
    return None


def last_step(state_dir: Path, name: str) -> int:
    """The last step used by `name` (-1: none)."""
    path = state_dir / CODES_FILE
    if not path.exists():
        return -1
    handle = os.open(path, os.O_RDONLY)
    try:
        return _last_steps(handle).get(name, -1)
    finally:
        os.close(handle)
