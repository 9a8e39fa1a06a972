"""bench_delta_image's quick run (no lab): one package more costs a delta of at most 15 % of the
full image, and the host's rebuild from it equals the new version."""

from __future__ import annotations

import json
import subprocess

from lab.state import REPO_ROOT, VENV_BIN


def test_delta_of_one_package_is_small_and_rebuilds_v2() -> None:
    proc = subprocess.run([str(VENV_BIN / "python"), str(REPO_ROOT / "bench" / "bench_delta_image.py"),
                           "--quick"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["quick"] is True and result["rebuilt_equals_v2"] is True, result
    assert 0 < result["delta_bytes"] < result["full_bytes"], result
    assert result["ratio"] == result["delta_bytes"] / result["full_bytes"] <= 0.15, result
