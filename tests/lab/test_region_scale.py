"""Opt-in (`-m scale`): the region-scale bench's quick run (5 simulated stores, 10 light minions
on a salt-master of its own): every minion answers, reconcile's Salt reads are complete, all come
back after the AES key rotation and after a master restart."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, VENV_BIN

pytestmark = [pytest.mark.scale]


@pytest.mark.timeout(900)
def test_region_scale_quick(tmp_path: Path) -> None:
    proc = subprocess.run([str(VENV_BIN / "python"),
                           str(REPO_ROOT / "bench" / "bench_region_scale.py"), "--quick"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["quick"] is True and "machine" in result
    (run,) = result["runs"]
    assert run["minions"] == 2 * run["stores"]
    assert run["reconcile_salt_reads"]["complete"] is True
    assert run["storm"]["rotated"] is True
    assert run["storm"]["answered"] == run["minions"] == run["restart"]["answered"]
    assert run["restart"]["all_back_s"] <= 120
    assert run["steady"]["master_cpu_seconds"] > 0
