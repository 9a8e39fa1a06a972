"""Light minions (lab/light_minions) sign in to a real salt-master with their own keys and
answer its publications through the request channel, each as itself."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from lab.light_minions.region import Master, Swarm, minion_ids
from lab.state import REPO_ROOT
from store_rollout.contracts import FIRSTBOOT_STAGE_GRAIN, HYPERVISOR_READY_GRAIN
from tasks.salt import SaltMasterClient


@pytest.fixture(scope="module")
def region() -> Iterator[tuple[Master, list[str]]]:
    # beside the labs, so that its ports are chosen among theirs
    root = REPO_ROOT / f".lab-light-minions-{os.getpid()}"
    master = Master.create(root)
    ids = minion_ids(3, prefix="lm")
    swarm = Swarm(master, ids)
    try:
        master.start()
        swarm.start(timeout=120)
        yield master, ids
    finally:
        swarm.stop()
        master.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(180)
def test_each_light_minion_answers_a_ping_as_itself(region: tuple[Master, list[str]]) -> None:
    master, ids = region
    salt = SaltMasterClient(str(master.config))
    assert set(salt.list_keys()["minions"]) >= set(ids)
    answers = salt.cmd_many([*ids, "store-lm9999-hv"], "test.ping", timeout=15)
    assert answers == dict.fromkeys(ids, True)  # the one with no key and no process: absent
    grains = salt.cmd_many(ids, "grains.item", [HYPERVISOR_READY_GRAIN, FIRSTBOOT_STAGE_GRAIN],
                           timeout=15)
    assert grains["store-lm0001-hv"][HYPERVISOR_READY_GRAIN] is True
    assert grains["store-lm0001-vm"][FIRSTBOOT_STAGE_GRAIN] == "done"
    wanted = {"store-lm0002-hv": {"domains": ["store-lm0002-vm"], "base_images": ["k1"]}}
    inspected = salt.cmd_many(["store-lm0002-hv", "store-lm0000-hv"], "storevirt.inspect",
                              [wanted], timeout=15)
    assert inspected["store-lm0002-hv"]["base_images"] == {"k1": True}
    assert list(inspected["store-lm0002-hv"]["domains"]) == ["store-lm0002-vm"]
    assert inspected["store-lm0000-hv"] == {"domains": {}, "base_images": {}}


def test_keys_are_each_minions_own(region: tuple[Master, list[str]]) -> None:
    master, ids = region
    accepted = {mid: (master.pki / "minions" / mid).read_text() for mid in ids}
    assert len(set(accepted.values())) == len(ids)


@pytest.mark.timeout(180)
def test_a_region_read_and_a_rerun_s_calls_are_answered_as_a_live_store(
        region: tuple[Master, list[str]]) -> None:
    """reconcile's inspect without names (tasks/observe.py) and step 4's compound job: a
    multi-function job is answered per function, as the master must store it."""
    from tasks.observe import _inspect
    from tasks.salt.probes import domain_with_current_extensions

    master, _ids = region
    salt = SaltMasterClient(str(master.config))
    hv, vm = "store-lm0002-hv", "store-lm0002-vm"
    inspected, failed = _inspect(salt, {hv: {"domains": [vm], "base_images": ["k1"]}})
    assert not failed and inspected[hv]["every_domain"] and inspected[hv]["base_images"] == {
        "k1": True}
    assert inspected[hv]["domains"][vm]["seed"]["minion_id"] == vm
    # without the master's hashes the light host syncs ([]) and is asked again: both jobs stored
    summary, synced = domain_with_current_extensions(salt, hv, vm)
    assert summary is not None and summary["name"] == vm and summary["active"]
    assert synced == []
