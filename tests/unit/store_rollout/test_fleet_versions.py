"""Issue 47, image versions in plan and reconcile (store_rollout/fleet/versions.py) on facts
built by hand: what an update would do, the version a VM runs against the one the inventory
expects, the VM's grain against its host's disk; and the batch's plan of an update
(store_rollout/waves.py). The lab: tests/lab/test_plan_reconcile.py, tests/fleet/."""

from __future__ import annotations

from typing import Any

import pytest

from store_rollout.fleet.facts import LastRun
from store_rollout.fleet.reconcile import reconcile_store
from store_rollout.fleet.render import plan_markdown, reconcile_table
from store_rollout.fleet.versions import store_versions, version_mismatches
from store_rollout.inventory import parse_inventory
from store_rollout.regions import ONE_REGION
from store_rollout.waves import UPDATE, plan_batch, store_run_params
from tests.unit.store_rollout.test_fleet_state import KEY, ZOMBIE, fresh, rolled_out

V2_KEY = "cd" * 32


def on(running: str, target: str, disk: str | None = None, **changes: Any) -> Any:
    """A live store whose VM says it runs `running` (its disk on `disk`, default the same),
    the inventory expecting `target`."""
    return rolled_out(**{"image_version": target, "image_key": V2_KEY,
                         "vm_image_version": running,
                         "disk_image_version": running if disk is None else disk, **changes})


def codes(facts: Any) -> list[str]:
    return [code for code, _, _ in version_mismatches(facts)]


def test_a_store_on_its_target_is_left_as_it_is() -> None:
    versions = store_versions(on("v2", "v2"))
    assert versions.would == "already on v2"
    assert (versions.running, versions.disk, versions.target) == ("v2", "v2", "v2")
    assert versions.disk_key == KEY  # from its disk's backing file
    status = reconcile_store(on("v2", "v2"), ZOMBIE)
    assert status.status == "ok" and status.mismatches == []
    assert status.versions is not None and status.versions.running == "v2"


def test_a_store_behind_would_be_updated_staged_or_not() -> None:
    assert store_versions(on("v1", "v2")).would == "update v1 -> v2 (staged)"
    behind = store_versions(on("v1", "v2", base_image_on_hypervisor=False)).would
    assert behind.startswith("update v1 -> v2 (not staged: the update downloads it first")
    silent_host = on("v1", "v2", domain_known=False, base_image_on_hypervisor=None)
    assert store_versions(silent_host).staged is None


def test_a_vm_that_runs_another_version_than_expected_is_a_mismatch_with_its_update() -> None:
    status = reconcile_store(on("v1", "v2"), ZOMBIE)
    assert status.status == "mismatch"
    [mismatch] = status.mismatches
    assert mismatch.code == "image-version-mismatch"
    assert mismatch.what == "VM store-0042-vm runs image version v1, the inventory expects v2"
    assert "`store-rollout update 0042 --image v2`" in mismatch.fix
    # the grain is the witness: a disk on v2 does not make a VM saying v1 right
    assert "image-version-mismatch" in codes(on("v1", "v2", disk="v2"))


def test_a_grain_and_a_disk_that_disagree_are_flagged() -> None:
    found = version_mismatches(on("v2", "v2", disk="v1"))
    assert [code for code, _, _ in found] == ["image-version-disagree"]
    _, what, fix = found[0]
    assert what == (f"VM store-0042-vm says it runs v2 but its system disk on store-0042-hv "
                    f"is on image {KEY[:12]} (v1)")
    assert "storevirt.update_record store-0042-vm" in fix
    # a disk whose image the cache does not know is no witness
    assert codes(on("v2", "v2", disk_image_version=None)) == []


def test_the_hosts_image_key_wins_over_the_backing_path() -> None:
    facts = on("v2", "v2")
    facts = facts.model_copy(update={"domain": {**(facts.domain or {}), "image_key": V2_KEY}})
    assert store_versions(facts).disk_key == V2_KEY


def test_unversioned_stores_match_an_unversioned_image() -> None:
    facts = rolled_out(image_version="", vm_image_version="unversioned",
                       disk_image_version="unversioned")
    assert store_versions(facts).target == "unversioned"
    assert codes(facts) == [] and reconcile_store(facts, ZOMBIE).status == "ok"


@pytest.mark.parametrize("facts", [
    fresh(image_version="v2"),  # never rolled out
    rolled_out(image_version="v2", vm_image_version="v1", erp_notices=[]),  # not live yet
])
def test_a_store_not_live_is_rolled_out_first_and_never_flagged(facts: Any) -> None:
    assert store_versions(facts).would.startswith("not live: roll out first")
    assert codes(facts) == []


def test_without_the_vms_word_its_disk_is_the_witness_and_without_both_nothing_is_said() -> None:
    facts = on("v1", "v2", vm_answering=False, vm_image_version=None, disk_image_version=None)
    assert store_versions(facts).would.startswith("unknown: store-0042-vm does not answer")
    assert codes(facts) == []
    # a VM that reports no version (silent, or an image without the grain): its disk says
    silent = on("v1", "v2", vm_image_version=None)
    assert store_versions(silent).would.startswith("update v1 -> v2")
    [(code, what, _)] = version_mismatches(silent)
    assert code == "image-version-mismatch" and what == (
        "VM store-0042-vm runs image version v1, the inventory expects v2 (its host's disk "
        "says so; the VM reports no version)")
    assert codes(on("v2", "v2", vm_image_version=None)) == []


def test_a_rollout_under_way_is_not_flagged_for_its_version() -> None:
    running = on("v1", "v2", last_run=LastRun(id="r2", name="rollout-0042", state="Running",
                                               heartbeat_age=1.0))
    assert reconcile_store(running, ZOMBIE).status == "running"


def test_plan_and_reconcile_show_the_versions() -> None:
    versions = {"0042": store_versions(on("v1", "v2"))}
    markdown = plan_markdown({"0042": []}, None, versions, {"0042": "next: Mon 22:00"})
    assert ("| 0042 | v1 | v1 | v2 | yes | next: Mon 22:00 | update v1 -> v2 (staged) |"
            in markdown), markdown
    [row] = reconcile_table([reconcile_store(on("v1", "v2", disk="v2"), ZOMBIE)])
    assert row["image version"] == "v1, disk v2 (target v2)"


def stores(n: int) -> Any:
    return parse_inventory({"stores": [
        {"store_id": f"u{i}", "erp": {"site_code": f"U{i}"},
         "hypervisor": {"hostname": f"hv-u{i}.example", "mac": f"52:54:00:00:00:0{i}"}}
        for i in range(1, n + 1)]}).stores


def test_an_update_batch_runs_each_store_as_a_run_of_its_own_in_waves() -> None:
    plan = plan_batch(stores(6), set(), ONE_REGION, "default", approval_policy="never",
                      ignore_windows=True, canary=1, wave_size=5, action=UPDATE)
    assert plan.as_deployment_runs and not plan.follow_windows
    assert plan.rounds == [{"default": ["u1"]},
                           {"default": ["u2", "u3", "u4", "u5", "u6"]}]
    rollout = plan_batch(stores(6), set(), ONE_REGION, "default", approval_policy="never",
                         ignore_windows=True, canary=1, wave_size=5)
    assert not rollout.as_deployment_runs  # unchanged for rollouts
    with pytest.raises(ValueError, match="action: 'upgrade' is no batch action"):
        plan_batch(stores(1), set(), ONE_REGION, "default", approval_policy="never",
                   ignore_windows=True, canary=1, wave_size=5, action="upgrade")


def test_an_update_batch_hands_each_run_the_version() -> None:
    params = store_run_params({}, "", False, run_of_its_own=True, image_version="v2")
    assert params == {"hold_fleet_slot": True, "image_version": "v2", "ignore_windows": False}
    assert "image_version" not in store_run_params({}, "", False, run_of_its_own=True)
