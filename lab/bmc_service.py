"""The store hosts' BMCs: VirtualBMC (IPMI 2.0 lanplus) and sushy-tools' emulator (Redfish),
both from PyPI in their own venv (.venv-bmc), both driving the store hosts' libvirt domains on
the lab's libvirtd, as OpenStack Ironic's and Metal3's CI do.

- `vbmcd` runs one IPMI endpoint per store host, added when the host is racked
  (lab/hardware.py); they listen on the orchestrator's loopback, the lab's management network.
- `sushy-emulator` serves every domain as a Redfish system (its id: the domain's name) on one
  loopback port, behind HTTP Basic auth (an htpasswd file of bcrypt digests, as it requires).

Both take the lab's BMC login (secrets.json); their logs record each power action, the
evidence a test reads: vbmcd's "Power off called for domain ...", sushy's
'System "..." power state set to "ForceOff"'.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lab.procs import ProcessRecord, spawn, wait_until
from lab.state import REPO_ROOT
from store_rollout.private_files import write_private

BMC_VENV = Path(os.environ.get("STORE_ROLLOUT_BMC_VENV", REPO_ROOT / ".venv-bmc"))
BMC_ADDRESS = "127.0.0.1"


@dataclass(frozen=True)
class BmcLabConfig:
    state_dir: Path  # <lab>/bmc
    logs: Path
    vbmcd_port: int  # vbmcd's control port (ZMQ, loopback)
    redfish_port: int
    user: str
    password: str
    libvirt_uri: str

    @property
    def vbmc_config(self) -> Path:
        return self.state_dir / "virtualbmc.conf"

    @property
    def vbmc_dir(self) -> Path:
        return self.state_dir / "vbmc"

    @property
    def redfish_config(self) -> Path:
        return self.state_dir / "sushy-emulator.conf"

    @property
    def htpasswd(self) -> Path:
        return self.state_dir / "htpasswd"

    @property
    def redfish_url(self) -> str:
        return f"http://{BMC_ADDRESS}:{self.redfish_port}"


def prepare(cfg: BmcLabConfig) -> None:
    """Config files of both emulators (rewritten on each `lab up`: ports and login may change)."""
    cfg.vbmc_dir.mkdir(parents=True, exist_ok=True)
    cfg.vbmc_config.write_text(
        "[default]\n"
        f"config_dir = {cfg.vbmc_dir}\n"
        f"pid_file = {cfg.state_dir / 'vbmcd.pid'}\n"
        f"server_port = {cfg.vbmcd_port}\n"
        "show_passwords = false\n"
        "[log]\n"
        f"logfile = {cfg.logs / 'vbmcd-bmcs.log'}\n"
        "debug = true\n")
    # sushy-tools takes bcrypt digests only; the password reaches bcrypt on stdin, not argv
    digest = subprocess.run(
        [str(BMC_VENV / "bin" / "python"), "-c",
         "import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.read().encode(), "
         "bcrypt.gensalt(rounds=8)).decode())"],
        input=cfg.password, capture_output=True, text=True, check=True).stdout.strip()
    write_private(cfg.htpasswd, f"{cfg.user}:{digest}\n")
    cfg.redfish_config.write_text(
        # a Python file: its INFO lines ('System "<uuid>" power state set to "On"') are the
        # record of each reset, and Flask's logger stops at WARNING unless told
        "import logging\n"
        "logging.getLogger('sushy_tools.emulator.main').setLevel(logging.INFO)\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {json.dumps(str(cfg.htpasswd))}\n"
        f"SUSHY_EMULATOR_LIBVIRT_URI = {json.dumps(cfg.libvirt_uri)}\n"
        f"SUSHY_EMULATOR_LISTEN_IP = {json.dumps(BMC_ADDRESS)}\n"
        f"SUSHY_EMULATOR_LISTEN_PORT = {cfg.redfish_port}\n")


def start_vbmcd(cfg: BmcLabConfig) -> ProcessRecord:
    # vbmcd starts again the BMCs its config dir holds as active (a lab restarted)
    return spawn([str(BMC_VENV / "bin" / "vbmcd"), "--foreground"], cfg.logs / "vbmcd.log",
                 env={**os.environ, "VIRTUALBMC_CONFIG": str(cfg.vbmc_config)})


def start_redfish(cfg: BmcLabConfig) -> ProcessRecord:
    return spawn([str(BMC_VENV / "bin" / "sushy-emulator"), "--config", str(cfg.redfish_config)],
                 cfg.logs / "redfish-bmc.log")


def wait_ready(cfg: BmcLabConfig) -> None:
    import requests

    def redfish_up() -> bool:
        try:
            return requests.get(f"{cfg.redfish_url}/redfish/v1/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def vbmcd_up() -> bool:
        from lab.hardware import vbmcd_request

        try:
            return vbmcd_request(cfg.vbmcd_port, {"command": "list"}, timeout_ms=1000)["rc"] == 0
        except TimeoutError:
            return False

    wait_until(redfish_up, 30, "Redfish BMC emulator (sushy-emulator)")
    wait_until(vbmcd_up, 30, "IPMI BMC emulator (vbmcd)")
