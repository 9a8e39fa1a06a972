"""A simulated region of N stores (2 light minions each, lab/light_minions) on one real
salt-master of its own: at each N, the master's CPU seconds per store over a steady interval
(a liveness ping of every minion every 10 s), the memory of the master and of the minions,
the wall time of reconcile's Salt reads (the same calls tasks/observe.py makes: key list,
grains.item of both minions of every store, storevirt.inspect of every hypervisor), the
re-authentication storm after the master rotates its AES key (a key deletion), and the time
until every minion answers again after a master restart. Prints one JSON object and writes it
to bench/region_scale.json (unless --quick); `--plot` draws docs/region-scale.png from it.

Not measured here (no Prefect server in this bench): the Prefect server's and PostgreSQL's
CPU, the 100-store wave through Prefect, the API's latency; see docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from common import REPO, emit, machine, percentile
from cpu import cpu_seconds

from lab.light_minions.region import Master, Swarm, minion_ids
from lab.state import VENV_BIN
from tasks.salt import SaltError

OUT = REPO / "bench" / "region_scale.json"
ROOT = REPO / ".lab-scale"
HV_GRAINS = ["store_rollout_hypervisor_ready", "firstboot_stage", "serialnumber",
             "store_image_version", "os", "osrelease"]


def client(master: Master) -> Any:
    from tasks.salt import SaltMasterClient

    return SaltMasterClient(str(master.config))


def ping_until_all(master: Master, ids: list[str], limit: float) -> tuple[float, int]:
    """Seconds until every minion of `ids` has answered test.ping (each answer counted once,
    a ping of the silent ones every round), and how many answered within `limit`."""
    started, answered = time.monotonic(), set[str]()
    salt = client(master)
    while len(answered) < len(ids) and time.monotonic() - started < limit:
        left = [m for m in ids if m not in answered]
        try:
            # 30 s: the publication itself waits that long for a request worker the storm's
            # sign-ins keep busy (5 s was refused every time at 2,000 minions)
            answered.update(salt.cmd_many(left, "test.ping", timeout=30))
        except SaltError:  # the publication refused: the master is busy signing minions in
            time.sleep(1)
    return time.monotonic() - started, len(answered)


def steady(master: Master, ids: list[str], seconds: float) -> dict[str, float]:
    """The master's CPU over `seconds` of a quiet region pinged every 10 s."""
    salt, pids = client(master), master.pids()
    before, started, pings, short = cpu_seconds(pids), time.monotonic(), [], []
    while time.monotonic() - started < seconds:
        t0 = time.monotonic()
        got = salt.cmd_many(ids, "test.ping", timeout=60)
        pings.append(time.monotonic() - t0)
        short.append(len(ids) - len(got))  # not answered within 60 s
        time.sleep(max(0.0, 10 - (time.monotonic() - t0)))
    used = cpu_seconds(master.pids()) - before
    wall = time.monotonic() - started
    return {"seconds": wall, "master_cpu_seconds": used, "master_cpu_pct": 100 * used / wall,
            "ping_all_p50_s": percentile(pings, 50), "ping_all_max_s": max(pings),
            "pings": len(pings), "unanswered_per_ping_max": max(short)}


def reconcile_reads(master: Master, stores: int, ids: list[str]) -> dict[str, Any]:
    """reconcile's Salt reads (tasks/observe.py's calls and arguments) on this region."""
    from tasks.observe import _answers, _inspect

    salt, started = client(master), time.monotonic()
    keys = salt.list_keys()
    hvs, vms = ids[0::2], ids[1::2]
    grains, _ = _answers(salt, hvs + vms, "grains.item", HV_GRAINS)
    inspected, failed = _inspect(salt, {hv: {"domains": [vm], "base_images": ["k" + "0" * 63]}
                                        for hv, vm in zip(hvs, vms, strict=True)
                                        if hv in grains})
    wall = time.monotonic() - started
    accepted = sum(1 for m in ids if m in set(keys.get("minions", [])))
    return {"wall_s": wall, "keys_accepted": accepted, "grains_answered": len(grains),
            "inspect_answered": len(inspected), "inspect_failed": len(failed),
            "complete": len(grains) == 2 * stores and len(inspected) == stores}


def storm(master: Master, ids: list[str]) -> dict[str, Any]:
    """A key deletion rotates the master's AES key; every minion signs in again when it cannot
    read the next publication: time until all answer, and the master's CPU meanwhile."""
    victim = master.pki / "minions" / "store-rotate-victim"
    victim.write_text((master.pki / "minions" / ids[0]).read_text())
    pids, before = master.pids(), cpu_seconds(master.pids())
    subprocess.run([str(VENV_BIN / "salt-key"), "-c", str(master.config.parent), "-y", "-d",
                    "store-rotate-victim"], check=True, capture_output=True, timeout=60)
    requested = time.monotonic()
    while master.rotation_pending() and time.monotonic() - requested < 120:
        time.sleep(0.2)
    rotated_after = time.monotonic() - requested
    wall, back = ping_until_all(master, ids, 300)
    return {"all_back_s": wall, "answered": back, "of": len(ids),
            "rotation_after_deletion_s": rotated_after, "rotated": not master.rotation_pending(),
            "master_cpu_seconds": cpu_seconds(pids) - before}


def restart(master: Master, ids: list[str]) -> dict[str, Any]:
    """The master stopped and started again: seconds from its start until every minion
    answers (acceptance at 100 stores: <= 120)."""
    master.stop()
    time.sleep(2)
    master.start()
    wall, back = ping_until_all(master, ids, 300)
    return {"all_back_s": wall, "answered": back, "of": len(ids)}


def measure(stores: int, steady_s: float, keys: Path, workers: int) -> dict[str, Any]:
    ids = minion_ids(stores)
    master = Master.create(ROOT / f"n{stores}-{int(time.time())}", worker_threads=workers)
    master.start()
    swarm = Swarm(master, ids, keys_dir=keys)
    result: dict[str, Any] = {"stores": stores, "minions": len(ids),
                              "master_worker_threads": workers or "lab default (3)"}
    phases = [("steady", lambda: steady(master, ids, steady_s)),
              ("reconcile_salt_reads", lambda: reconcile_reads(master, stores, ids)),
              ("storm", lambda: storm(master, ids)), ("restart", lambda: restart(master, ids))]
    try:
        result["signin_all_s"] = swarm.start()
        time.sleep(5)
        result.update({"swarm_rss_mib": swarm.rss() / 2**20,
                       "rss_per_minion_kib": swarm.rss() / 1024 / len(ids)})
        for name, phase in phases:  # a phase that fails is recorded, the next ones still run
            swarm_pids = [swarm.proc.pid] if swarm.proc else []
            cpu_before = (cpu_seconds(master.pids()), cpu_seconds(swarm_pids))
            try:
                result[name] = phase()
                # whose CPU the phase took (a restart's new master is a new process tree)
                if isinstance(result[name], dict) and name != "restart":
                    result[name]["cpu_seconds"] = {
                        "master": cpu_seconds(master.pids()) - cpu_before[0],
                        "swarm": cpu_seconds(swarm_pids) - cpu_before[1]}
            except Exception as exc:
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            result["master_rss_mib"] = max(result.get("master_rss_mib", 0), master.rss() / 2**20)
            (ROOT / f"run-{stores}.partial.json").write_text(json.dumps(result, default=str))
        result["swarm_cpu_seconds"] = cpu_seconds([swarm.proc.pid]) if swarm.proc else None
        if "master_cpu_seconds" in result["steady"]:
            result["master_cpu_seconds_per_store_per_hour"] = (
                result["steady"]["master_cpu_seconds"] / result["steady"]["seconds"] * 3600
                / stores)
        return result
    finally:
        swarm.stop()
        master.stop()
        shutil.copyfile(swarm.dir / "swarm.log", ROOT / f"swarm-{stores}.log")
        shutil.rmtree(master.root, ignore_errors=True)


def others_running() -> list[str]:
    """What else ran on the machine (other helpers' labs and tests): the busiest processes."""
    procs = sorted(psutil.process_iter(["name", "cpu_percent"]),
                   key=lambda p: p.info["cpu_percent"] or 0)
    time.sleep(1)
    busy = [(p.cpu_percent(), p.info["name"]) for p in procs if p.is_running()]
    return [f"{name} {pct:.0f}%" for pct, name in sorted(busy, reverse=True)[:8] if pct > 5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="N = 5, 10-s steady interval")
    parser.add_argument("--stores", type=int, nargs="*", default=[100, 300, 1000])
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--worker-threads", type=int, default=0,
                        help="the master's request workers (default: the lab's 3)")
    parser.add_argument("--plot", action="store_true", help="only draw docs/ from the JSON")
    args = parser.parse_args()
    if args.plot:
        from plot_region_scale import plot

        plot(json.loads(OUT.read_text()), REPO / "docs" / "region-scale.png")
        return
    counts, steady_s = ([5], 10.0) if args.quick else (args.stores, args.steady)
    keys = ROOT / "keys"
    from lab.light_minions.swarm import key_pool

    key_pool(keys, 2 * max(counts))  # generated once, before anything is timed
    load_before = psutil.getloadavg()
    runs = []
    for n in counts:
        runs.append(measure(n, steady_s, keys, args.worker_threads))
        if not args.quick:  # each N's figures kept as soon as measured
            (ROOT / f"run-{n}.json").write_text(json.dumps(runs[-1], default=str))
    result = {"benchmark": "region_scale", "quick": args.quick, "runs": runs,
              "loadavg_before": load_before, "loadavg_after": psutil.getloadavg(),
              "busy_processes_after": others_running(), "machine": machine()}
    if not args.quick:
        previous = json.loads(OUT.read_text()) if OUT.exists() else {"runs": []}
        kept = [r for r in previous["runs"] if r["stores"] not in counts]
        result["runs"] = sorted(kept + runs, key=lambda r: r["stores"])
        OUT.write_text(json.dumps(result, indent=1, default=str) + "\n")
    emit(result)


if __name__ == "__main__":
    main()
