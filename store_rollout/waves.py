"""Batch planning: canary first, then fixed-size waves; halting on the failure ratio."""

from __future__ import annotations

from collections.abc import Sequence


def plan_waves(store_ids: Sequence[str], canary: int, wave_size: int) -> list[list[str]]:
    """[canary wave, wave, wave, ...]; the canary wave is skipped when canary is 0."""
    if canary < 0 or wave_size < 1:
        raise ValueError("canary must be >= 0 and wave_size >= 1")
    ids = list(store_ids)
    waves = [ids[:canary]] if canary else []
    rest = ids[canary:]
    waves += [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]
    return [w for w in waves if w]


def should_halt(failed: int, finished: int, threshold: float) -> bool:
    """Halt the remaining waves when failed / finished is strictly above the threshold."""
    return finished > 0 and failed / finished > threshold


def runs_of_their_own(approval_policy: str, ignore_windows: bool, calendars: bool) -> bool:
    """Whether a batch's stores are runs of the store-rollout deployment instead of subflows of
    the batch: when they wait for their windows (`calendars`, not overridden) or may ask for an
    approval before any change (a subflow inside the batch's task can neither pause nor be
    parked)."""
    return (calendars and not ignore_windows) or approval_policy == "always"
