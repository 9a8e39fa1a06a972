"""A simulated region for the scale bench and its tests: a real salt-master of its own (the lab's
master config, in its own directory, on loopback ports chosen as the lab chooses them) and a
swarm of light minions, 2 per store (`store-<id>-hv`, `store-<id>-vm`), in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from lab import ports
from lab.procs import ProcessRecord, stop, tree_rss
from lab.salt_master import start, wait_ready, write_config
from lab.state import REPO_ROOT

PORTS = ("publish", "ret")


def minion_ids(stores: int, prefix: str = "sim") -> list[str]:
    return [f"store-{prefix}{i:04d}-{kind}" for i in range(stores) for kind in ("hv", "vm")]


@dataclass
class Master:
    """The region's salt-master: its directory, config, ports and (while up) its process."""

    root: Path
    config: Path
    publish_port: int
    ret_port: int
    record: ProcessRecord | None = None
    pki_dir: Path | None = None  # a master of the lab's own (default: the region's)

    def pids(self) -> list[int]:
        if self.record is None:
            return []
        try:
            top = psutil.Process(self.record.pid)
            return [top.pid] + [p.pid for p in top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @property
    def pki(self) -> Path:
        return self.pki_dir or self.root / "salt" / "root" / "master" / "pki"

    @classmethod
    def create(cls, root: Path, worker_threads: int = 0) -> Master:
        """`worker_threads`: the master's request workers (0: the lab's own number)."""
        root.mkdir(parents=True, exist_ok=True)
        with ports.labs_locked(root.parent):
            chosen = ports.choose(PORTS, root, {})
            (root / ports.PORTS_FILE).write_text(json.dumps(chosen))
        config = write_config(root / "salt", chosen["publish"], chosen["ret"],
                              master_id="scale-master")
        # the maintenance loop (AES rotation after a key deletion) every 5 s, not 60
        data = yaml.safe_load(config.read_text())
        tuned = {"loop_interval": 5, **({"worker_threads": worker_threads} if worker_threads else {})}
        config.write_text(yaml.safe_dump({**data, **tuned}, sort_keys=True))
        return cls(root, config, chosen["publish"], chosen["ret"])

    def start(self) -> None:
        self.record = start(self.root / "salt", self.root / "salt-master.out")
        wait_ready(self.config, timeout=60)

    def stop(self) -> None:
        if self.record is not None:
            stop(self.record, grace=10)
            self.record = None

    def rss(self) -> int:
        return tree_rss(self.record) if self.record else 0

    def rotation_pending(self) -> bool:
        """An AES key rotation requested (a key deletion's drop file) and not yet done."""
        return (self.root / "salt" / "root" / "master" / "cache" / ".dfn").exists()


class Swarm:
    """The light minions of `ids`, in one process; `start` returns once all are signed in."""

    def __init__(self, master: Master, ids: list[str], key_pool: int = 0,
                 keys_dir: Path | None = None) -> None:
        self.master, self.ids = master, ids
        self.dir = master.root / "swarm"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "ids").write_text("\n".join(ids) + "\n")
        self.key_pool = key_pool or len(ids)
        self.keys_dir = keys_dir or self.dir / "keys"
        self.proc: subprocess.Popen[str] | None = None
        self.signin_seconds = float("nan")

    def start(self, timeout: float = 900) -> float:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lab.light_minions.swarm", "--ids-file",
             str(self.dir / "ids"), "--dir", str(self.dir), "--master-port",
             str(self.master.ret_port), "--publish-port", str(self.master.publish_port),
             "--master-pki", str(self.master.pki), "--key-pool", str(self.key_pool),
             "--keys-dir", str(self.keys_dir)],
            stdout=subprocess.PIPE, stderr=open(self.dir / "swarm.log", "a"),  # noqa: SIM115
            text=True, env=env, cwd=REPO_ROOT)
        started = time.monotonic()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "ready N seconds"
        if not line.startswith("ready"):
            raise RuntimeError(f"light minions: the swarm exited before signing in "
                               f"(see {self.dir / 'swarm.log'})")
        self.signin_seconds = time.monotonic() - started
        return self.signin_seconds

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss if self.proc else 0

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
