"""Every benchmark runs once in --quick mode, so none can rot. No timing is asserted.

Four quick runs are opt-in (`make test-bench`, marker bench_covered) because default tests run
the same behaviour in the same lab: bench_overhead's one rollout under `measuring()` is any
rollout's (tests/unit/store_rollout/test_instrument.py shows the measured time follows the flow into
its task runs); bench_resume's failed-at-step-6-then-resumed rollout is
test_faults.py::test_vm_minion_not_back_after_first_reboot_then_rerun (plus the resume checks
of test_cancel.py and test_plan_reconcile.py's rollout killed in step 5), and
bench_batch's batches of 1 and 2 are test_rollout_e2e.py::test_one_store_then_two_at_once and
test_batch.py; bench_plan_reconcile's plan and reconcile after a rollout are
test_plan_reconcile.py; bench_update_downtime's one update is test_image_update.py's. Their
JSON shape is still checked whenever they run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, VENV_BIN

BENCHES = {
    "bench_disk.py": ["copy_over_overlay_ratio", "overlay_seconds_median", "copy_seconds_median"],
    "bench_cache.py": ["first_kiwi_seconds", "second_kiwi_seconds", "second_hit"],
    "bench_event_reaction.py": ["event_p50_seconds", "event_p99_seconds", "poll_p50_seconds"],
    "bench_overhead.py": ["wall_seconds_median", "external_seconds_median",
                          "overhead_seconds_median", "overhead_ratio_median"],
    "bench_resume.py": ["seconds_until_step6_median", "seconds_until_step6",
                        "seconds_until_step1_median"],
    "bench_batch.py": ["batches", "ratio_to_single",
                       "capacity_stores_per_hour_per_control_plane_core"],
    "bench_key_rotation.py": ["minions_connected", "reauthenticated_after_delete",
                              "quiet_window_auth_minions", "key_deleted"],
    "bench_image_delivery.py": ["first_over_ideal", "resumed_fraction", "rerun", "goals"],
    "bench_api_burst.py": ["runs_created", "lost", "states", "slots_left_taken",
                           "wall_seconds", "server_cpu_seconds_per_run"],
    "bench_regions.py": ["wall_seconds", "regions", "chain_cpu_seconds_per_store"],
    "bench_plan_reconcile.py": ["plan_seconds_median", "reconcile_seconds_median",
                                "plan_salt_jobs", "reconcile_salt_jobs", "goals"],
    "bench_region_wave.py": ["wave", "one_store_alone", "signin_seconds", "max_in_flight"],
    "bench_update_downtime.py": ["downtime_seconds_median", "downtime_seconds",
                                 "update_run_seconds_median", "outcomes"],
}


COVERED_BY_DEFAULT_TESTS = {"bench_resume.py", "bench_batch.py", "bench_plan_reconcile.py",
                            "bench_overhead.py", "bench_update_downtime.py"}
# with the fleet tier (make test-fleet): key rotation waits past the master's 60-s maintenance
# loop; the API burst's quick run is five more rollouts through the worker; regions brings up
# the lab's second region (its master and worker) for two more rollouts
FLEET = {"bench_key_rotation.py", "bench_api_burst.py", "bench_regions.py"}


# with the scale tier (-m scale): the region wave's light stores through a batch (docs/scaling.md)
SCALE = {"bench_region_wave.py"}


def marks(name: str) -> list[pytest.MarkDecorator]:
    return ([pytest.mark.bench_covered] if name in COVERED_BY_DEFAULT_TESTS else []) + \
        ([pytest.mark.fleet] if name in FLEET else []) + \
        ([pytest.mark.scale] if name in SCALE else [])


@pytest.mark.lab
@pytest.mark.parametrize("script", [pytest.param(name, marks=marks(name))
                                    for name in sorted(BENCHES)])
def test_benchmark_quick(script: str, lab_env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run([str(VENV_BIN / "python"), str(REPO_ROOT / "bench" / script), "--quick"],
                          env=lab_env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in BENCHES[script]:
        assert key in result, f"{script} lost {key}"
    assert result["quick"] is True and "machine" in result
    if script == "bench_cache.py":
        assert result["second_hit"] is True and result["second_kiwi_seconds"] == 0
    if script in ("bench_overhead.py",):
        assert result["completed"] == result["stores"]
    if script == "bench_batch.py":
        assert all(b["completed"] == int(k) for k, b in result["batches"].items())
        assert all(b["control_plane_per_store"] > 0 for b in result["batches"].values())
    if script == "bench_key_rotation.py":
        assert result["completed"] == result["stores"] and result["key_deleted"] is True
        assert result["minions_connected"] == 2 * result["stores"]
    if script == "bench_api_burst.py":
        assert result["lost"] == 0 and result["not_finished"] == 0, result
        assert result["states"] == {"COMPLETED": result["stores"]}, result
        assert result["slots_left_taken"] == {}, result
    if script == "bench_region_wave.py":
        wave = result["wave"]
        assert result["one_store_alone"]["state"] == "Completed", result
        assert wave["completed"] == result["stores"] and wave["batch_state"] == "Completed"
        assert wave["lost"] == wave["stuck"] == wave["not_completed"] == [], result
        assert 0 < wave["in_flight_max"] <= result["max_in_flight"], result
        assert wave["api"]["errors"] == 0 and wave["control_plane_per_store"] > 0, result
        # reconcile read every store of the region afterwards (the warm-up one too)
        assert sum(wave["reconcile"]["counts"].values()) == result["stores"] + 1, result
    if script == "bench_regions.py":
        assert result["batch_rc"] == 0, result
        for region in result["regions"].values():
            assert region["completed"] == 1 and region["store_minions_on_master"] == 2, result
            assert region["other_region_minions_on_master"] == 0, result
            assert region["master_cpu_seconds_per_store"] > 0, result
    if script == "bench_plan_reconcile.py":
        assert result["completed"] == result["stores"] and result["plan_cli_rc"] == 0, result
        assert result["plan_todo_after_rollout"] == [], result
        assert result["reconcile_counts"] == {"ok": result["stores"]}, result
        # one job per kind, whatever the number of stores
        assert all(n == 1 for n in result["reconcile_salt_jobs"].values()), result
    if script == "bench_image_delivery.py":
        assert result["goals"]["resumed_at_most_55_percent"] and result["goals"]["rerun_zero_bytes"]
        assert result["goals"]["first_verified"] and result["cut"]["error"]
    if script == "bench_resume.py":
        assert result["first_run"] == "Failed" and result["final_rerun"] == "Completed"
        assert result["reruns"] == len(result["seconds_until_step6"]) == 2
