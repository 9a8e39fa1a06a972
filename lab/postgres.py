"""A PostgreSQL cluster initialised in the lab dir, listening on 127.0.0.1 only, for Prefect."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from lab.procs import ProcessRecord, spawn, wait_until
from store_rollout.private_files import write_private

DB_USER = "prefect"
DB_NAME = "prefect"


def _pg_bin(tool: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{tool}"))
    if not candidates:
        raise FileNotFoundError(
            f"PostgreSQL server binary {tool!r} not found: run `make setup` (apt package postgresql)"
        )
    return candidates[-1]


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def prepare(pg_dir: Path, password: str) -> None:
    """initdb once; the server refuses to run as root, so the cluster belongs to `postgres`."""
    data = pg_dir / "data"
    if (data / "PG_VERSION").exists():
        return
    if data.exists():
        shutil.rmtree(data)  # a half-initialised cluster from a crashed `lab up`
    (pg_dir / "sock").mkdir(parents=True, exist_ok=True)
    pwfile = pg_dir / "pwfile"
    write_private(pwfile, password + "\n")
    _chown_tree(pg_dir, "postgres")
    subprocess.run(
        [_pg_bin("initdb"), "-D", str(data), "-U", DB_USER, f"--pwfile={pwfile}",
         "--auth-host=scram-sha-256", "--auth-local=peer", "-E", "UTF8", "--no-instructions"],
        check=True, user="postgres", capture_output=True, cwd=pg_dir,
    )
    pwfile.unlink()


def start(pg_dir: Path, port: int, log: Path) -> ProcessRecord:
    argv = [
        _pg_bin("postgres"), "-D", str(pg_dir / "data"), "-h", "127.0.0.1", "-p", str(port),
        "-k", str(pg_dir / "sock"),
        "-c", "shared_buffers=32MB", "-c", "max_connections=200", "-c", "fsync=off",
        "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
    ]
    log.touch()
    return spawn(argv, log, user="postgres", cwd=pg_dir)


def wait_ready(pg_dir: Path, port: int, password: str, timeout: float = 30) -> None:
    env = {**os.environ, "PGPASSWORD": password}
    psql = shutil.which("psql") or "psql"

    def database_answers() -> bool:
        res = subprocess.run(
            [psql, "-h", "127.0.0.1", "-p", str(port), "-U", DB_USER, "-d", "postgres",
             "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{DB_NAME}'"],
            env=env, capture_output=True, text=True, timeout=5,
        )
        if res.returncode != 0:
            return False
        if res.stdout.strip() != "1":
            subprocess.run(
                [psql, "-h", "127.0.0.1", "-p", str(port), "-U", DB_USER, "-d", "postgres",
                 "-c", f"CREATE DATABASE {DB_NAME}"],
                env=env, check=True, capture_output=True, timeout=10,
            )
        return True

    wait_until(database_answers, timeout, "PostgreSQL", interval=0.3)


def url(port: int, password: str) -> str:
    return f"postgresql+asyncpg://{DB_USER}:{password}@127.0.0.1:{port}/{DB_NAME}"
