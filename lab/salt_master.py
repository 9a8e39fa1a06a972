"""The lab's salt-master: the lab's Salt overlay and the project's `salt_states/` as file_roots, a
lab pillar, reactors, autosign grains."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from lab.procs import ProcessRecord, spawn
from lab.state import LAB_FILE_ROOTS, SALT_STATES_DIR, VENV_BIN
from store_rollout.contracts import AUTOSIGN_GRAIN
from store_rollout.private_files import open_private

if TYPE_CHECKING:
    from lab.prefect_access import PrefectAccess


def daemon_paths(root: Path, daemon: str) -> dict[str, str]:
    """A lab Salt daemon's files, all under its own `root` (nothing under /etc or /var)."""
    return {"root_dir": str(root), "pki_dir": str(root / "pki"), "cachedir": str(root / "cache"),
            "sock_dir": str(root / "sock"), "pidfile": str(root / f"salt-{daemon}.pid"),
            "log_file": str(root / f"{daemon}.log")}


def salt_env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def reactor_config() -> list[dict[str, list[str]]]:
    """Tag -> reactor sls, from `salt_states/reactor/reactor.yaml`, made absolute."""
    spec = yaml.safe_load((SALT_STATES_DIR / "reactor" / "reactor.yaml").read_text()) or {}
    return [
        {tag: [str(SALT_STATES_DIR / "reactor" / name) for name in files]}
        for tag, files in spec.items()
    ]


def write_config(salt_dir: Path, publish_port: int, ret_port: int,
                 prefect: PrefectAccess | None = None, master_id: str = "lab-master",
                 backup_pillar: dict[str, str] | None = None) -> Path:
    """`backup_pillar`: the store_backup ext_pillar's options (lab/backup_server.py): each store
    VM's backup credentials in its own pillar (issue 48)."""
    root = salt_dir / "root" / "master"
    conf_dir = salt_dir / "etc" / "master"
    pillar = salt_dir / "pillar"
    for d in (root, conf_dir, pillar, root / "autosign_grains"):
        d.mkdir(parents=True, exist_ok=True)
    (pillar / "top.sls").write_text("base:\n  '*':\n    - lab\n")
    # lab minions run on the lab host itself: the overlay's parameters of that host (Debian)
    # exclude host-changing states
    (pillar / "lab.sls").write_text(
        # os_family: the parameters of the host the lab's minions run on; its startup highstates
        # under load may render before the grains are loaded (as grains['id'] was, see ready)
        yaml.safe_dump({"hypervisor": {"os_family": "Debian"},
                        # a booted lab guest (full lab) reboots at once, not a minute later
                        "provisioning": {"reboot_delay_minutes": 0}})
    )
    grains_file = root / "autosign_grains" / AUTOSIGN_GRAIN
    os.close(open_private(grains_file, os.O_WRONLY | os.O_CREAT))  # 0600 from its creation
    os.chmod(grains_file, 0o600)  # one an older lab made otherwise
    engines: list[Any] = ["store_autosign_guard"]
    if prefect is not None:
        # the rollout's Salt events show up in the Prefect UI's event feed; the engine logs in
        # with the credential's file (0600; this config names it, never holds it) and verifies
        # the API's TLS with the lab CA
        engines.append({"store_prefect_events": {
            "api_url": prefect.api_url, "auth_string_file": str(prefect.auth_file),
            "ca_file": str(prefect.ca_file),
            "prefixes": ["store/", "salt/key", "salt/minion/store-"]}})
    config = {
        "id": master_id,
        "user": "root",
        "interface": "127.0.0.1",
        "publish_port": publish_port,
        "ret_port": ret_port,
        **daemon_paths(root, "master"),
        "log_level_logfile": "info",
        # the overlay first: Salt serves the first root that has a path
        "file_roots": {"base": [str(root) for root in LAB_FILE_ROOTS]},
        "pillar_roots": {"base": [str(pillar)]},
        "worker_threads": 3,
        "open_mode": False,
        "auto_accept": False,
        # must sit under root_dir or Salt prefixes it again (notes/salt.md §6)
        "autosign_grains_dir": str(root / "autosign_grains"),
        "reactor": reactor_config(),
        "keep_jobs_seconds": 3600,
        # a one-time token signs in its own minion id only, and once (the guard engine reads
        # which token an accepted key came with from the salt/auth event)
        "auth_events_autosign_grains": ["accept"],
        # a decommission's data disk export: the host pushes it here (cp.push), the worker
        # moves it out at once (docs/production.md, issue 47)
        "file_recv": True,
        "file_recv_max_size": 1024,
        "engines_dirs": [str(SALT_STATES_DIR / "_engines")],
        "engines": engines,
        # salt_states/_pillar/ (production: saltutil.sync_pillar into extension_modules)
        **({"pillar_dirs": [str(SALT_STATES_DIR / "_pillar")],
            "ext_pillar": [{"store_backup": backup_pillar}]} if backup_pillar else {}),
    }
    path = conf_dir / "master"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


def start(salt_dir: Path, log: Path) -> ProcessRecord:
    conf_dir = salt_dir / "etc" / "master"
    return spawn([str(VENV_BIN / "salt-master"), "-c", str(conf_dir), "-l", "warning"], log,
                 env=salt_env())


def wait_ready(master_config: Path, timeout: float = 30) -> None:
    """Ready when the master event bus accepts a subscriber and carries an event we fire."""
    import salt.config
    import salt.utils.event

    from tasks.salt import prepare_salt_runtime

    prepare_salt_runtime()  # Salt's logger levels, in the process that polls (pytest, the CLI)
    opts = salt.config.master_config(str(master_config))
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True) as bus:
                bus.subscribe("lab/ready-probe")
                probe = f"lab/ready-probe/{time.time_ns()}"
                bus.fire_event({"probe": True}, probe)
                event = bus.get_event(wait=2, tag=probe, full=True)
                if event:
                    return
        except Exception as exc:  # the publisher socket appears ~1 s after spawn
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"lab: salt-master event bus not ready after {timeout}s ({last!r})")
