"""The Prefect server on the lab's PostgreSQL, bound to 127.0.0.1 behind TLS and basic auth
(lab/prefect_access.py), and the process worker that runs the deployments of `prefect.yaml`
(runs started from the UI or the REST API).

`prefect server start` serves plain HTTP only: the lab runs the same app (Prefect's
`create_app`, services included) under uvicorn with uvicorn's own TLS."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from pathlib import Path

import requests

from lab.prefect_access import PrefectAccess, TlsFiles, read_auth_string
from lab.procs import ProcessRecord, spawn, wait_until
from lab.state import REPO_ROOT, VENV_BIN, LabPaths
from tasks.slots import FILESYSTEM_LEASE_STORAGE

PREFECT_YAML = REPO_ROOT / "prefect.yaml"


def api_url(port: int) -> str:
    return f"https://127.0.0.1:{port}/api"


def ui_url(port: int) -> str:
    return f"https://127.0.0.1:{port}"


def _env_without_prefect() -> dict[str, str]:
    """This process's environment minus any PREFECT_* setting (the lab sets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}


def server_env(prefect_home: Path, port: int, database_url: str) -> dict[str, str]:
    env = _env_without_prefect()
    env.update(
        PREFECT_HOME=str(prefect_home),
        # what the UI in the browser calls; unset, it is the default port 4200, not this server
        PREFECT_SERVER_UI_API_URL=api_url(port),
        PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false",
        # the UI's own address: automations' messages link to run pages with it (`ui_url`)
        PREFECT_UI_URL=ui_url(port),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=database_url,
        # default recorder batches fall behind with concurrent rollouts (notes/prefect.md §10)
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE="200",
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL="1",
        PREFECT_LOGGING_LEVEL="WARNING",
        # slot leases on disk (PREFECT_HOME/concurrency_leases): a restarted server still
        # knows who holds which slot and frees a dead holder's (tasks/slots.py)
        PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=FILESYSTEM_LEASE_STORAGE,
    )
    return env


def start(prefect_home: Path, port: int, database_url: str, log: Path, tls: TlsFiles,
          auth_file: Path) -> ProcessRecord:
    """The server with auth on (the credential in its environment, which only its owner reads;
    never on the command line) and TLS with the lab's certificate."""
    prefect_home.mkdir(parents=True, exist_ok=True)
    argv = [str(VENV_BIN / "uvicorn"), "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--ssl-keyfile", str(tls.key), "--ssl-certfile", str(tls.chain)]
    env = server_env(prefect_home, port, database_url)
    env.update(PREFECT_SERVER_API_AUTH_STRING=read_auth_string(auth_file),
               # what `prefect server start` tells create_app: the last app of this process
               PREFECT__SERVER_FINAL="1",
               PREFECT_SERVER_UI_ENABLED="false" if os.environ.get("STORE_ROLLOUT_NO_UI")
               else "true")
    return spawn(argv, log, env=env)


def health(access: PrefectAccess) -> bool:
    try:  # the health path answers without a login; TLS is verified
        resp = access.session().get(f"{access.api_url}/health", timeout=2)
    except requests.ConnectionError:
        return False
    return resp.status_code == 200 and resp.json() is True


def wait_ready(access: PrefectAccess, timeout: float = 60) -> None:
    wait_until(lambda: health(access), timeout, "Prefect server", interval=0.3)


@functools.cache
def work_pool() -> str:
    """The one work pool the deployments of prefect.yaml name (the lab's worker polls it)."""
    from app.deployments import work_pools

    pools = work_pools(PREFECT_YAML)
    if len(pools) != 1:
        raise RuntimeError(f"{PREFECT_YAML}: the lab runs one work pool, the deployments name {pools}")
    return pools.pop()


def client_env(access: PrefectAccess, prefect_home: Path, state_dir: Path) -> dict[str, str]:
    """A Prefect client of the lab's server whose flows use the lab (worker, deploy): it
    authenticates and verifies the server with the lab CA."""
    env = _env_without_prefect()
    env.update(**access.env(), PREFECT_HOME=str(prefect_home),
               PREFECT_SERVER_ANALYTICS_ENABLED="false",
               STORE_ROLLOUT_SETTINGS_FILE=str(LabPaths(state_dir).settings_file),
               STORE_ROLLOUT_HOME=str(REPO_ROOT))
    return env


def ensure_work_pool(access: PrefectAccess) -> None:
    """The deployments' process work pool, as `prefect work-pool create --type process` makes
    it (the process worker's default job template), made here: two CLI calls cost 5 s a lab."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with access.settings(), SyncPrefectClient(access.api_url,
                                              auth_string=access.auth_string) as client:
        try:
            client.read_work_pool(work_pool())
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_work_pool(WorkPoolCreate(
                    name=work_pool(), type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template()))


def save_bmc_block(access: PrefectAccess, name: str, username: str, password: str) -> None:
    """The lab BMCs' login as the flows get it: a BMC Credentials Block (never a setting)."""
    from pydantic import SecretStr

    from tasks.bmc import BmcCredentials

    with access.settings():
        BmcCredentials(username=username, password=SecretStr(password)).save(name, overwrite=True)


def save_secret_blocks(access: PrefectAccess, secrets: dict[str, str]) -> None:
    """The lab's Cobbler password and ERP token as the flows get them: Prefect Secret blocks
    the settings name ({block name: secret}; never a setting)."""
    from prefect.blocks.system import Secret
    from pydantic import SecretStr

    with access.settings():
        for name, value in secrets.items():
            block: Secret[str] = Secret(value=SecretStr(value))
            block.save(name, overwrite=True)


def save_notification_block(access: PrefectAccess, reference: str, url: str) -> None:
    """The lab's chat channel as the automations send to it: a webhook notification block
    (`reference`: custom-webhook/<name>)."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    with access.settings():
        CustomWebhookNotificationBlock(
            name="lab chat", url=url, method="POST",
            json_data={"subject": "{{subject}}", "body": "{{body}}"}, headers=None,
            cookies=None).save(reference.split("/", 1)[1], overwrite=True)


def register_deployments(access: PrefectAccess, env: dict[str, str], log: Path) -> None:
    """The work pool and `prefect deploy --all` of prefect.yaml, exactly as in production."""
    ensure_work_pool(access)
    with open(log, "ab") as out:
        deploy = subprocess.run([str(VENV_BIN / "prefect"), "--no-prompt", "deploy", "--all"],
                                env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                timeout=300)
    if deploy.returncode != 0:
        raise RuntimeError(f"prefect deploy --all of {PREFECT_YAML} failed; see {log}")


def start_worker(env: dict[str, str], log: Path, limit: int = 10, pool: str | None = None,
                 name: str = "lab-worker") -> ProcessRecord:
    """A process worker on the deployments' pool (or a region's `pool`); it polls every 2 s
    so a UI click starts soon."""
    argv = [str(VENV_BIN / "prefect"), "worker", "start", "--pool", pool or work_pool(),
            "--name", name, "--limit", str(limit), "--type", "process"]
    return spawn(argv, log, env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2"}, cwd=REPO_ROOT)


def wait_worker_online(access: PrefectAccess, timeout: float = 60, pool: str | None = None,
                       name: str = "lab-worker") -> None:
    pool = pool or work_pool()

    def online() -> bool:
        resp = access.session().post(f"{access.api_url}/work_pools/{pool}/workers/filter",
                                     json={}, timeout=5)
        return resp.status_code == 200 and any(
            w["name"] == name and w["status"] == "ONLINE" for w in resp.json())

    wait_until(online, timeout, f"Prefect worker {name} on pool {pool}", interval=0.5)
