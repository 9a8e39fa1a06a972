"""Issue 6: a batch in waves with one injected failure; the halt threshold; the table artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.prefect_access import PrefectAccess, api_session
from lab.state import LabInfo, LabPaths
from tests.helpers import check_store, result_from_systems, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.extended]


def max_overlap(rows: list[dict[str, Any]]) -> int:
    edges = sorted([(r["began"], 1) for r in rows if r["began"]] +
                   [(r["ended"], -1) for r in rows if r["ended"]])
    current = peak = 0
    for _, delta in edges:
        current += delta
        peak = max(peak, current)
    return peak


def test_batch_of_five_halts_after_threshold(lab: LabInfo, lab_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"b{i}" for i in range(1, 6)]
    inv = write_inventory(tmp_path / "inv.yaml", ids, "52:54:00:ba:00", lab=lab)
    raw = yaml.safe_load(inv.read_text())
    raw["stores"][3]["hypervisor"]["cobbler_profile"] = "no-such-profile"  # b4 fails
    inv.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("STORE_ROLLOUT_SETTINGS_FILE", str(LabPaths(lab_dir).settings_file))
    with PrefectAccess.of(lab).settings():
        from flows.batch_rollout import batch_rollout

        state = batch_rollout(str(inv), ids, canary=1, wave_size=3, max_in_flight=2,
                              halt_failure_ratio=0.2, return_state=True)
    assert state.is_completed(), state.message
    rows = {r["store_id"]: r for r in state.result()}
    # waves: [b1] [b2 b3 b4] [b5]; after wave 1: 1 failed / 4 finished = 0.25 > 0.2 -> halt
    for sid in ("b1", "b2", "b3"):
        assert rows[sid]["state"] == "Completed" and rows[sid]["step_reached"] == "notify_erp"
    assert rows["b4"]["state"] == "Failed" and rows["b4"]["step_reached"] == "validation"
    assert "no-such-profile" in rows["b4"]["error"]
    assert rows["b5"]["state"] == "Skipped" and "halted after wave 1" in rows["b5"]["error"]
    # three stores in the wave, never more than max_in_flight of them at once
    assert max_overlap(list(rows.values())) <= 2
    for sid in ("b1", "b2", "b3"):
        check_store(lab, sid, {"erp_id": rows[sid]["erp_id"], **result_from_systems(lab, sid)})
    # the table artifact says the same
    artifacts = api_session(lab).post(f"{lab.prefect_api_url}/artifacts/latest/filter", json={
        "artifacts": {"key": {"any_": ["batch-stores"]}}}, timeout=10).json()
    data = artifacts[0]["data"]
    table = json.loads(data) if isinstance(data, str) else data
    assert {r["store_id"]: r["state"] for r in table} == {
        sid: row["state"] for sid, row in rows.items()}
