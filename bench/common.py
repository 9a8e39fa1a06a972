"""Shared plumbing for the benchmarks: the lab's settings, fresh stores, cleanup, stats."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.state import LabInfo, LabPaths, load_lab_info  # noqa: E402

# Salt's LocalClient prints notices to stdout; a benchmark's stdout is its JSON object only
sys.stdout = sys.stderr


def lab_info() -> LabInfo:
    """The running lab; its Prefect API is then known to `api_session(url)`."""
    from lab.prefect_access import PrefectAccess

    info = load_lab_info()
    PrefectAccess.of(info)
    return info


@contextmanager
def prefect_on_lab(info: LabInfo) -> Iterator[None]:
    """Prefect as `store-rollout`'s commands set it (app/runner.py), on the lab's server."""
    from app.runner import command_prefect_settings
    from lab.prefect_access import PrefectAccess

    os.environ.setdefault("STORE_ROLLOUT_SETTINGS_FILE",
                          str(LabPaths(Path(info.state_dir)).settings_file))
    # the lab's server over TLS, logged in with the lab's credential
    with command_prefect_settings(), PrefectAccess.of(info).settings():
        yield


def fresh_inventory(info: LabInfo, path: Path, prefix: str,
                    count: int) -> tuple[Path, list[str]]:
    """Stores no earlier run has used (ids and MACs from the clock), so each is a full rollout;
    their hosts racked in the lab, every other one behind IPMI, the rest behind Redfish."""
    stamp = int(time.time() * 10) % 0xFFFF
    ids = [f"{prefix}{stamp:04x}-{i}" for i in range(count)]
    stores = [{"store_id": sid,
               "hypervisor": {"hostname": f"hv-{sid}.bench.invalid",
                              "mac": f"5a:54:{stamp >> 8:02x}:{stamp & 0xFF:02x}:00:{i:02x}"},
               "vm": {"vcpus": 1, "memory_mib": 128, "disk_gib": 2, "network": "none"},
               "erp": {"site_code": f"B-{i}"}} for i, sid in enumerate(ids)]
    path.write_text(yaml.safe_dump({"stores": stores}))
    from lab.hardware import rack_inventory

    rack_inventory(info, path)
    return path, ids


def cleanup(info: LabInfo, store_ids: list[str]) -> None:
    """Remove what the benchmark created: VM, keys, the host and its BMC, Cobbler record;
    a few stores at a time (one store takes seconds: a Salt job, key deletions, Cobbler)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda sid: cleanup_store(info, sid), store_ids))


def cleanup_store(info: LabInfo, sid: str) -> None:
    """cleanup() of one store."""
    from tasks.cobbler import CobblerClient, CobblerError
    from tasks.salt import SaltError, SaltMasterClient

    master = SaltMasterClient(info.salt_master_config)
    cobbler = CobblerClient(url=info.cobbler_url, user=info.cobbler_user,
                            password=info.cobbler_password)
    hv, vm = f"store-{sid}-hv", f"store-{sid}-vm"
    with suppress(SaltError):
        master.cmd(hv, "storevirt.remove_vm", [vm], timeout=30)
    for minion in (vm, hv):
        master.delete_key(minion)
        master.revoke_token(minion)
    from lab.hardware import unrack

    unrack(info, sid)  # the host off (its minion and VM with it) and gone, with its BMC
    try:
        if cobbler.get_system(hv) is not None:
            cobbler.remove_system(hv)
    except CobblerError:
        pass


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * pct / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release(), "kvm": os.path.exists("/dev/kvm")}


def emit(result: dict[str, Any]) -> None:
    """The one JSON object, on the real stdout (everything else was sent to stderr)."""
    print(json.dumps(result, default=lambda v: round(v, 4) if isinstance(v, float) else str(v)),
          file=sys.__stdout__, flush=True)
