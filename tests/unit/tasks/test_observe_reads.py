"""reconcile's and plan's Salt reads give a region's minions time to answer (tasks/observe.py)."""

from __future__ import annotations

from typing import Any

from tasks.observe import READ_SECONDS_PER_MINION, READ_TIMEOUT, _answers
from tasks.salt import SaltCommandFailed


class RecordingMaster:
    """Answers every minion at once and keeps the job timeout each read was given."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def cmd_many(self, minions: list[str], fun: str, arg: list[Any], *,
                 kwarg: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        self.timeouts.append(timeout)
        return {m: (SaltCommandFailed(m, fun, 1, "no") if m.endswith("-bad") else True)
                for m in minions}


def test_a_read_of_a_whole_region_gets_time_per_minion() -> None:
    master = RecordingMaster()
    few = [f"store-{i}-hv" for i in range(2)]
    region = [f"store-{i}-{kind}" for i in range(1000) for kind in ("hv", "vm")]
    _answers(master, few, "test.ping", [])  # type: ignore[arg-type]
    ok, failed = _answers(master, region + ["store-x-bad"], "test.ping", [])  # type: ignore[arg-type]
    # 3 s published a job to 2,000 minions of one master on 2 cores: refused, "not responding"
    assert master.timeouts[0] < READ_TIMEOUT + 0.1
    assert master.timeouts[1] >= READ_TIMEOUT + 2000 * READ_SECONDS_PER_MINION >= 20
    assert len(ok) == 2000 and list(failed) == ["store-x-bad"]
