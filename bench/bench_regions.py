"""A batch over two regions (`lab up --regions 2`, brought up here if the lab has one): N stores
per region, each store a run of its region's deployment on its region's worker. Reports the wall
time, the stores and minions each master holds afterwards, and the CPU seconds per store of each
region's salt-master and worker (the flow runs) apart from the chain's shared Prefect server and
PostgreSQL: what a region costs per store, hence how many stores one master host takes.
Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, cleanup, emit, fresh_inventory, lab_info, machine
from cpu import snapshot

from lab.hardware import unrack
from lab.manager import Lab
from lab.regions import SECOND_MASTER, SECOND_REGION, SECOND_WORKER
from lab.state import VENV_BIN, LabInfo, LabPaths

REGION_PROCESSES = {"default": ("salt-master", "prefect-worker"),
                    SECOND_REGION: (SECOND_MASTER, SECOND_WORKER)}
CHAIN_PROCESSES = ("prefect-server", "postgres", "cobblerd", "cobbler-http")


def accepted(master_config: str) -> list[str]:
    """The accepted keys of a master, as `salt-key` lists them (a process of its own)."""
    listed = subprocess.run([str(VENV_BIN / "salt-key"), "-c", str(Path(master_config).parent),
                             "--list", "accepted", "--out", "json"],
                            capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(listed.stdout).get("minions", []))


def forget_second_region_stores(info: LabInfo, ids: list[str]) -> None:
    """cleanup() of r2's stores: their keys on r2's master, their hosts and Cobbler records."""
    from tasks.cobbler import CobblerClient

    conf = str(Path(info.region2_salt_master_config).parent)
    minions = [f"store-{sid}-{kind}" for sid in ids for kind in ("hv", "vm")]
    subprocess.run([str(VENV_BIN / "salt-key"), "-c", conf, "-y", "-d", ",".join(minions)],
                   capture_output=True, timeout=60, check=False)
    cobbler = CobblerClient(url=info.cobbler_url, user=info.cobbler_user,
                            password=info.cobbler_password)
    for sid in ids:
        unrack(info, sid)
        if cobbler.get_system(f"store-{sid}-hv") is not None:
            cobbler.remove_system(f"store-{sid}-hv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one store per region")
    parser.add_argument("--per-region", type=int, default=5)
    args = parser.parse_args()
    per_region = 1 if args.quick else args.per_region
    lab = Lab.at(Path(lab_info().state_dir))
    had_regions = lab_info().regions
    info = lab.up(regions=2)
    inventory, ids = fresh_inventory(info, Path(tempfile.mkdtemp()) / "inv.yaml", "rg-",
                                     2 * per_region)
    second = ids[per_region:]
    raw = yaml.safe_load(inventory.read_text())
    for store in raw["stores"]:
        if store["store_id"] in second:
            store["region"] = SECOND_REGION
    inventory.write_text(yaml.safe_dump(raw))
    env = {"STORE_ROLLOUT_SETTINGS_FILE": str(LabPaths(Path(info.state_dir)).settings_file),
           "PATH": str(VENV_BIN) + ":/usr/bin:/bin", "HOME": str(Path.home())}
    try:
        before = snapshot(info)
        started = time.perf_counter()
        done = subprocess.run([str(VENV_BIN / "store-rollout"), "batch", "--inventory",
                               str(inventory), "--canary", "0", "--wave-size", str(per_region),
                               "--max-in-flight", str(2 * per_region), "--json"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - started
        after = snapshot(info)
        rows = json.loads(done.stdout) if done.stdout.strip() else []
        keys = {"default": accepted(info.salt_master_config),
                SECOND_REGION: accepted(info.region2_salt_master_config)}
    finally:
        cleanup(info, ids[:per_region])
        forget_second_region_stores(info, second)
        if had_regions != 2:
            lab.up(regions=had_regions)  # the lab as it was
    used = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    regions = {}
    for region, (master, worker) in REGION_PROCESSES.items():
        mine = ids[:per_region] if region == "default" else second
        regions[region] = {
            "completed": sum(r["state"] == "Completed" for r in rows if r["store_id"] in mine),
            "store_minions_on_master": sum(k.startswith(tuple(f"store-{s}-" for s in mine))
                                           for k in keys[region]),
            "other_region_minions_on_master": sum(
                k.startswith(tuple(f"store-{s}-" for s in ids if s not in mine))
                for k in keys[region]),
            "master_cpu_seconds_per_store": round(used.get(master, 0.0) / per_region, 3),
            "worker_cpu_seconds_per_store": round(used.get(worker, 0.0) / per_region, 3)}
    emit({"benchmark": "regions", "stores_per_region": per_region, "wall_seconds": wall,
          "batch_rc": done.returncode, "regions": regions,
          "chain_cpu_seconds_per_store": {name: round(used.get(name, 0.0) / len(ids), 3)
                                          for name in CHAIN_PROCESSES},
          "machine": machine(), "quick": args.quick})


if __name__ == "__main__":
    main()
