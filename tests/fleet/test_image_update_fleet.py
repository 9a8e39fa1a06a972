"""Issue 47, a fleet of store servers updated to a new image in waves (opt-in, `-m fleet`):
six stores rolled out on v1, then one batch of updates to v2 with a canary of 1. The new
version is made to fail on one store of the second wave (the per-machine fault knob
`service_start@<vm>`: the store's services cannot start in its update boot, so its update
highstate fails, as its go-live gate would): that store reverts by itself to v1, its gate
passing within 300 s of the failed check, its data disk's file intact; the other five run
v2, as their VMs' grains say (not the runs); the ERP has five `store-image-updated` notices and
none for the reverted store.
A second batch (back to v1) with two forced failures in one wave, above its halt threshold,
stops the later wave: its stores are left on v2, no run made for them.

The pure rules (waves, halting, rows) are unit-tested in tests/unit/store_rollout/; the update
of one store, and its revert, in the default tier (tests/lab/, helper i47-update's)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.prefect_access import PrefectAccess, api_session
from lab.state import LAB_IMAGE_VERSIONS, LabInfo, LabPaths
from store_rollout.contracts import (
    DATA_DISK_MOUNT,
    ERP_STORE_IMAGE_UPDATED,
    IMAGE_VERSION_GRAIN,
)
from tests.helpers import created_erp_notices, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.fleet]

STORES = [f"iu{n}" for n in range(1, 7)]
REVERTED = "iu4"  # in the second wave (the canary is iu1)
MARKER = (DATA_DISK_MOUNT.lstrip("/"), "issue-47-marker.txt")  # on the data disk


@pytest.fixture
def versioned_lab(lab: LabInfo, lab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`batch(inventory, ids, **params)`: the batch flow in this process against the lab (whose
    settings list v1, the chain's, and v2: lab/state.py), its rows by store; the stores' runs
    of store-image-update are the lab worker's."""
    assert set(LAB_IMAGE_VERSIONS) >= {"v1", "v2"}
    monkeypatch.setenv("STORE_ROLLOUT_SETTINGS_FILE", str(LabPaths(lab_dir).settings_file))
    with PrefectAccess.of(lab).settings():
        from flows.batch_rollout import batch_rollout

        def batch(inventory: Path, ids: list[str], **params: Any) -> dict[str, Any]:
            state = batch_rollout(str(inventory), tuple(ids), return_state=True, **params)
            assert state.is_completed(), state.message
            return {row["store_id"]: row for row in state.result()}

        yield batch


def with_calendar(inventory: Path, path: Path) -> Path:
    """The inventory with every store's maintenance window open all day (UTC)."""
    raw = yaml.safe_load(inventory.read_text())
    for store in raw["stores"]:
        store["calendar"] = {"time_zone": "UTC", "windows": ["daily 00:00-24:00"]}
    path.write_text(yaml.safe_dump(raw))
    return path


def grain_versions(lab: LabInfo, ids: list[str]) -> dict[str, Any]:
    """What each store's VM says it runs (its grain), through the master."""
    from tasks.salt import SaltMasterClient

    master = SaltMasterClient(lab.salt_master_config)
    try:
        return {sid: (master.cmd(f"store-{sid}-vm", "grains.item", [IMAGE_VERSION_GRAIN],
                                 timeout=15) or {}).get(IMAGE_VERSION_GRAIN) for sid in ids}
    finally:
        master.close()


def vm_call(lab: LabInfo, sid: str, fun: str, *args: Any) -> Any:
    from tasks.salt import SaltMasterClient

    master = SaltMasterClient(lab.salt_master_config)
    try:
        return master.cmd(f"store-{sid}-vm", fun, list(args), timeout=30)
    finally:
        master.close()


def task_runs(lab: LabInfo, flow_run_id: str) -> dict[str, dict[str, Any]]:
    """The flow run's task runs by name (`<step>-<store>`), the newest of each name."""
    runs = api_session(lab).post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"flow_run_id": {"any_": [flow_run_id]}},
        "sort": "EXPECTED_START_TIME_ASC"}, timeout=10).json()
    return {run["name"]: run for run in runs}


def ended(run: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(run["end_time"]).replace("Z", "+00:00"))


def started(run: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(run["start_time"]).replace("Z", "+00:00"))


def updated_notices(lab: LabInfo, sid: str) -> list[dict[str, Any]]:
    return [n for n in created_erp_notices(lab, sid)
            if (n.get("payload") or {}).get("status") == ERP_STORE_IMAGE_UPDATED]


def test_a_fleet_updated_in_waves_one_store_reverting_by_itself(
        lab: LabInfo, versioned_lab: Any, faults: Any, tmp_path: Path) -> None:
    batch = versioned_lab
    inventory = write_inventory(tmp_path / "inventory.yaml", STORES, "52:54:00:4f:00", lab=lab)
    rolled = batch(inventory, STORES, canary=0, wave_size=6, max_in_flight=6)
    assert {sid: row["state"] for sid, row in rolled.items()} == dict.fromkeys(STORES,
                                                                               "Completed")
    assert grain_versions(lab, STORES) == dict.fromkeys(STORES, "v1")
    markers = {}
    for sid in STORES:  # the store's data, on its data disk, written by its VM's minion
        markers[sid] = str(vm_call(lab, sid, "provisioning.root_path", *MARKER))
        assert vm_call(lab, sid, "file.write", markers[sid], f"till journal of {sid}")
    # file.write ends the file with a newline: what each reads now is what it must read after
    written = {sid: vm_call(lab, sid, "file.read", markers[sid]) for sid in STORES}
    assert written == {sid: f"till journal of {sid}\n" for sid in STORES}

    # the updates in the stores' windows (open all day: an update under ignore_windows needs a
    # person's approval, as the guard says), each a run of store-image-update in the worker
    in_windows = with_calendar(inventory, tmp_path / "in-windows.yaml")
    faults(f"service_start@store-{REVERTED}-vm", {"fail": 1})
    rows = batch(in_windows, STORES, action="update", image_version="v2", canary=1,
                 wave_size=5, max_in_flight=5, halt_failure_ratio=0.2)
    updated = [sid for sid in STORES if sid != REVERTED]
    assert {sid: rows[sid]["state"] for sid in updated} == dict.fromkeys(updated, "Completed")
    failed = rows[REVERTED]
    assert failed["state"] == "Failed", failed  # 1 of 6 failed: no halt at 0.2
    # the knob's boot: the update highstate cannot start the store's services (nor could the
    # gate find them running): the first check of the new version to fail is named
    assert "failed on the new version and was reverted to v1 (its go-live gate passes; the " \
        "ERP was not notified): the update highstate (state.apply store_vm) failed" \
        in failed["error"], failed

    # the VMs say what they run, not the runs
    assert grain_versions(lab, STORES) == {**dict.fromkeys(updated, "v2"), REVERTED: "v1"}
    for sid in STORES:
        assert vm_call(lab, sid, "file.read", markers[sid]) == written[sid], sid
    # back on v1, its gate passing, within 300 s of the failed check
    steps = task_runs(lab, str(failed["flow_run_id"]))
    check, regate = steps[f"update_highstate-{REVERTED}"], steps[f"revert_go_live-{REVERTED}"]
    assert (check["state_type"], regate["state_type"]) == ("FAILED", "COMPLETED"), (check, regate)
    back_in = (ended(regate) - ended(check)).total_seconds()
    print(f"{REVERTED}: back on v1 with its gate passing {back_in:.0f} s after the failed check")
    assert back_in <= 300, back_in
    for sid in updated:  # the lab's figure: from the shutdown to the minion back on v2
        run = task_runs(lab, str(rows[sid]["flow_run_id"]))
        down = ended(run[f"vm_back-{sid}"]) - started(run[f"shutdown-{sid}"])
        print(f"{sid}: down {down.total_seconds():.1f} s for its update, run "
              f"{rows[sid]['seconds']} s")
    assert {sid: len(updated_notices(lab, sid)) for sid in STORES} == {
        **dict.fromkeys(updated, 1), REVERTED: 0}

    # a second batch, back to v1: two forced failures in its second wave, above its threshold
    # (2 of 3 > 0.4; one would be 1 of 3, below it), stop the third
    order = ["iu1", "iu2", "iu3", "iu5", "iu6"]
    faults("service_start@store-iu2-vm", {"fail": 1})
    faults("service_start@store-iu3-vm", {"fail": 1})
    second = batch(in_windows, order, action="update", image_version="v1", canary=1,
                   wave_size=2, max_in_flight=2, halt_failure_ratio=0.4)
    assert {sid: second[sid]["state"] for sid in order} == {
        "iu1": "Completed", "iu2": "Failed", "iu3": "Failed", "iu5": "Skipped",
        "iu6": "Skipped"}, second
    assert "halted after wave 1" in second["iu5"]["error"]
    assert "flow_run_id" not in second["iu5"]  # no run made for a skipped store
    assert grain_versions(lab, order) == {"iu1": "v1", "iu2": "v2", "iu3": "v2", "iu5": "v2",
                                          "iu6": "v2"}
