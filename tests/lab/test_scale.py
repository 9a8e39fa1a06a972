"""Opt-in (`make test-scale`): the lab holds a batch of 25 stores, at most 5 in flight, with no
lost or stuck run. Uses the batch benchmark, so the test and the published figure are one run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, VENV_BIN

pytestmark = [pytest.mark.lab, pytest.mark.scale]


@pytest.mark.timeout(2400)
def test_batch_of_25_stores_has_no_lost_or_stuck_run(lab_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    proc = subprocess.run([str(VENV_BIN / "python"), str(REPO_ROOT / "bench" / "bench_batch.py"),
                           "--sizes", "25", "--max-in-flight", "5"],
                          env=lab_env, capture_output=True, text=True, timeout=2400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    batch = json.loads(proc.stdout.strip().splitlines()[-1])["batches"]["25"]
    assert batch == {**batch, "completed": 25, "failed_or_missing": 0, "runs_not_finished": 0}
