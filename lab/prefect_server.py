"""`prefect server start` on the lab's PostgreSQL, bound to 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path

import requests

from lab.procs import ProcessRecord, spawn, wait_until
from lab.state import VENV_BIN


def server_env(prefect_home: Path, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=database_url,
        # default recorder batches fall behind with concurrent rollouts (notes/prefect.md §10)
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE="200",
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL="1",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    return env


def start(prefect_home: Path, port: int, database_url: str, log: Path) -> ProcessRecord:
    prefect_home.mkdir(parents=True, exist_ok=True)
    argv = [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
            "--port", str(port), "--no-ui" if os.environ.get("STORE_ROLLOUT_NO_UI") else "--ui"]
    return spawn(argv, log, env=server_env(prefect_home, database_url))


def health(port: int) -> bool:
    resp = requests.get(f"http://127.0.0.1:{port}/api/health", timeout=2)
    return resp.status_code == 200 and resp.json() is True


def wait_ready(port: int, timeout: float = 60) -> None:
    wait_until(lambda: health(port), timeout, "Prefect server", interval=0.3)
