"""Batch planning (pure logic)."""

import pytest

from store_rollout.waves import plan_waves, should_halt


def test_plan_waves_canary_then_fixed_size() -> None:
    ids = [f"s{i}" for i in range(6)]
    assert plan_waves(ids, canary=1, wave_size=2) == [["s0"], ["s1", "s2"], ["s3", "s4"], ["s5"]]
    assert plan_waves(ids, canary=0, wave_size=4) == [["s0", "s1", "s2", "s3"], ["s4", "s5"]]
    assert plan_waves(ids[:1], canary=3, wave_size=2) == [["s0"]]
    with pytest.raises(ValueError):
        plan_waves(ids, canary=1, wave_size=0)


def test_halt_is_strictly_above_threshold() -> None:
    assert not should_halt(0, 0, 0.0)
    assert should_halt(1, 1, 0.2)  # a failed canary halts
    assert not should_halt(1, 5, 0.2)  # exactly the threshold: go on
    assert should_halt(1, 5, 0.1)
