"""Issue 47, versions across the fleet: each store's target version and image (one lookup per
version), the version a cached image key was built as (tasks/image_targets.py), an update
batch's window and deployment (tasks/store_runs.py, flows/batch_rollout.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from store_rollout.image_versions import ImageVersionError
from store_rollout.inventory import parse_inventory
from tasks.image_targets import target_images, target_versions, version_of_key
from tasks.store_runs import UPDATE_DEPLOYMENT, update_start_time
from tests.unit.store_rollout.test_image_versions import images
from tests.unit.tasks.test_store_runs import MONDAY_NOON, store


def stores(versions: list[str | None]) -> Any:
    return parse_inventory({"stores": [
        {"store_id": f"t{i}", "erp": {"site_code": f"T{i}"},
         "hypervisor": {"hostname": f"hv-t{i}.example", "mac": f"52:54:00:00:01:0{i}"},
         **({"vm": {"image_version": v}} if v else {})}
        for i, v in enumerate(versions, start=1)]}).stores


def test_stores_are_grouped_by_the_version_they_should_run() -> None:
    fleet = stores([None, "v2", None, "v2"])
    assert target_versions(fleet, images()) == {"v1": ["t1", "t3"], "v2": ["t2", "t4"]}
    # an upcoming update names one version for every store
    assert target_versions(fleet, images(), "v2") == {"v2": ["t1", "t2", "t3", "t4"]}
    with pytest.raises(ImageVersionError, match="image_version: image version 'v9' is not"):
        target_versions(fleet, images(), "v9")


def test_each_version_is_looked_up_once_and_keys_differ_by_version(tmp_path: Path) -> None:
    fleet = stores([None, "v2", None])
    found = target_images(fleet, images(), str(tmp_path), "kiwi")
    assert {sid: t["version"] for sid, t in found.items()} == {"t1": "v1", "t2": "v2",
                                                               "t3": "v1"}
    assert found["t1"]["key"] == found["t3"]["key"] != found["t2"]["key"]
    assert not any(t["cached"] for t in found.values())  # nothing built


def test_a_cached_key_says_the_version_it_was_built_as(tmp_path: Path) -> None:
    for key, params in (("a" * 64, {"IMAGE_VERSION": "v2", "SALT_MASTER": "x"}),
                        ("b" * 64, {"SALT_MASTER": "x"})):
        (tmp_path / key).mkdir()
        (tmp_path / key / "image.qcow2").write_bytes(b"qcow")
        (tmp_path / key / "meta.json").write_text(json.dumps({"key": key, "params": params}))
    assert version_of_key(str(tmp_path), "a" * 64) == "v2"
    assert version_of_key(str(tmp_path), "b" * 64) == "unversioned"
    # not in the cache, or no key: unknown, never guessed
    assert version_of_key(str(tmp_path), "c" * 64) is None
    assert version_of_key(str(tmp_path), None) is None


def test_an_update_is_scheduled_into_a_window_with_room_for_one_restart() -> None:
    # Tokyo 19:00, the window closes in 30 min: room for an update of 20 min, not for 45
    short = store({"time_zone": "Asia/Tokyo", "windows": ["daily 18:00-19:30"]})
    start, why = update_start_time(short, MONDAY_NOON, 1200.0)
    assert start == MONDAY_NOON and "image update starts in the maintenance window" in why
    start, why = update_start_time(short, MONDAY_NOON, 2700.0)
    assert start == datetime(2026, 6, 2, 9, 0, 1, tzinfo=UTC), why
    assert update_start_time(store(None), MONDAY_NOON, 1200.0)[0] is None  # no calendar


def test_an_update_batch_checks_its_version_and_uses_the_update_deployment() -> None:
    from flows.batch_rollout import batch_deployment

    settings = images()
    assert batch_deployment("update", "v2", "store-rollout/store-rollout",
                            settings) == UPDATE_DEPLOYMENT
    assert batch_deployment("update", "", "x", settings) == UPDATE_DEPLOYMENT
    assert batch_deployment("rollout", "", "store-rollout/x", settings) == "store-rollout/x"
    with pytest.raises(ImageVersionError, match="image_version: image version 'v9'"):
        batch_deployment("update", "v9", "x", settings)
    with pytest.raises(ValueError, match="image_version: only an update batch"):
        batch_deployment("rollout", "v2", "x", settings)


def test_the_batch_flow_takes_an_update_as_parameters() -> None:
    """Its parameters validate as Prefect validates a run's (a deployment run, the UI)."""
    from flows.batch_rollout import batch_rollout

    given = {"inventory": "inv.yaml", "action": "update", "image_version": "v2"}
    assert {k: batch_rollout.validate_parameters(given)[k] for k in given} == given
