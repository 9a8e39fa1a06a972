"""Batch planning: canary first, then fixed-size waves; halting on the failure ratio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store_rollout.approval_policy import NOT_FAILED


def plan_waves(store_ids: Sequence[str], canary: int, wave_size: int) -> list[list[str]]:
    """[canary wave, wave, wave, ...]; the canary wave is skipped when canary is 0."""
    if canary < 0 or wave_size < 1:
        raise ValueError("canary must be >= 0 and wave_size >= 1")
    ids = list(store_ids)
    waves = [ids[:canary]] if canary else []
    rest = ids[canary:]
    waves += [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]
    return [w for w in waves if w]


def plan_region_waves(regions: dict[str, str], canary: int,
                      wave_size: int) -> list[dict[str, list[str]]]:
    """Waves per region, run side by side: round k holds each region's wave k ({region:
    stores}). `regions`: store -> its region, in batch order. Each region has its own canary
    and halts on its own failures: one region's broken master does not stop the others."""
    per_region: dict[str, list[str]] = {}
    for store_id, region in regions.items():
        per_region.setdefault(region, []).append(store_id)
    planned = {region: plan_waves(ids, canary, wave_size) for region, ids in per_region.items()}
    rounds = max((len(waves) for waves in planned.values()), default=0)
    return [{region: waves[number] for region, waves in planned.items() if number < len(waves)}
            for number in range(rounds)]


def should_halt(failed: int, finished: int, threshold: float) -> bool:
    """Halt the remaining waves when failed / finished is strictly above the threshold."""
    return finished > 0 and failed / finished > threshold


def regions_to_halt(rows: list[dict[str, Any]], regions: list[str],
                    threshold: float) -> dict[str, tuple[int, int]]:
    """Of `regions`, those whose finished stores (batch rows, each with its `region` and
    `state`) failed above `threshold`: region -> (failed, finished). A region halts on its own
    stores' failures only."""
    halting = {}
    for region in regions:
        ended = [row for row in rows if row["region"] == region]
        # a store that waits for an approval, or that a person rejected, has not failed
        failed = sum(1 for row in ended if row["state"] not in NOT_FAILED)
        if should_halt(failed, len(ended), threshold):
            halting[region] = (failed, len(ended))
    return halting


def runs_of_their_own(approval_policy: str, ignore_windows: bool, calendars: bool,
                      other_regions: bool = False) -> bool:
    """Whether a batch's stores are runs of the store-rollout deployment instead of subflows of
    the batch: when they wait for their windows (`calendars`, not overridden), may ask for an
    approval before any change (a subflow inside the batch's task can neither pause nor be
    parked) or belong to other regions than the batch's process (`other_regions`: only a
    worker of their region reaches their Salt master)."""
    return (calendars and not ignore_windows) or approval_policy == "always" or other_regions
