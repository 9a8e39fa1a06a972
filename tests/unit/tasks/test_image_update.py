"""Issue 47: an image update's wait for the VM's minion after a boot (tasks/image_update.py):
back only when it answers with its accepted key; a second key for its id fails at once."""

from __future__ import annotations

import pytest

from tasks.image_update import VmNotBack, minion_back
from tasks.salt import MinionKeyContested
from tests.unit.store_rollout.test_step_rules import STORE


class Master:
    """Answers after `silent` polls; `keys` is what key.list_all shows."""

    def __init__(self, silent: int, state: str = "accepted",
                 keys: dict[str, list[str]] | None = None) -> None:
        self.silent, self.state, self.pings = silent, state, 0
        self.keys = keys or {"minions": [STORE.vm_minion_id]}
        self.deleted: list[str] = []

    def list_keys(self) -> dict[str, list[str]]:
        return self.keys

    def key_state(self, _minion: str) -> str:
        return self.state

    def ping(self, _minion: str) -> bool:
        self.pings += 1
        return self.pings > self.silent

    def fingerprints(self, minion: str) -> dict[str, list[str]]:
        return {"minions": ["aa"], "minions_denied": ["bb"]}

    def delete_key(self, minion: str) -> bool:
        self.deleted.append(minion)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_vm_is_back_when_it_answers_with_its_accepted_key() -> None:
    clock = Clock()
    assert minion_back(Master(silent=3), STORE, 60, clock, clock.sleep) == 6.0  # type: ignore[arg-type]
    # a minion whose key is not accepted does not count, however it answers
    clock = Clock()
    with pytest.raises(VmNotBack, match="did not answer with its accepted key within 10 s"):
        minion_back(Master(silent=0, state="pending"), STORE, 10, clock, clock.sleep)  # type: ignore[arg-type]
    assert clock.now >= 10


def test_a_second_key_for_the_vm_fails_at_once() -> None:
    master = Master(silent=0, keys={"minions": [STORE.vm_minion_id],
                                    "minions_denied": [STORE.vm_minion_id]})
    with pytest.raises(MinionKeyContested):
        minion_back(master, STORE, 60, Clock(), lambda _s: None)  # type: ignore[arg-type]
    assert master.deleted == [STORE.vm_minion_id] and master.pings == 0
