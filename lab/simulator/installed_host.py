"""What an installed store host's minion is, from the files its install wrote: which Salt's
configuration (SUSE's salt-minion in /etc/salt, or the Salt Bundle in /etc/venv-salt-minion),
its minion.d files and id, the extension modules written ahead of its first start, and its
platform, which decides the Salt the lab runs for it (lab/state.py PLATFORM_SALT_BIN)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from store_rollout.contracts import STORE_PLATFORM_GRAIN
from store_rollout.platforms import PLATFORMS

# each Salt's configuration directory on a host: SUSE's salt-minion (and upstream onedir), the
# Salt Bundle (venv-salt-minion)
SALT_CONFIG_DIRS = ("/etc/salt", "/etc/venv-salt-minion")
BUNDLE_CONFIG_DIR = "/etc/venv-salt-minion"
# salt-minion's extension modules where its config sets none (its extension_modules default)
DEFAULT_EXTMODS = "/var/cache/salt/minion/extmods/"
# the profile's own minion config, the one holding the grains
STORE_CONF = "50-store-rollout.conf"
# the platform of a host whose profile names none, by the installer that wrote it
INSTALLER_PLATFORM: dict[str, str] = {p.installer: p.name for p in PLATFORMS.values()}


@dataclass(frozen=True)
class InstalledMinion:
    config_dir: str
    minion_id: str
    platform: str
    minion_d: dict[str, str] = field(default_factory=dict)  # file name -> text
    extmods: dict[str, str] = field(default_factory=dict)  # absolute path -> text
    grains: dict[str, Any] = field(default_factory=dict)


def installed_minion(files: dict[str, str], installer: str | None = None,
                     fallback_id: str = "") -> InstalledMinion:
    """The minion an install's `files` (absolute path -> text) set up; `installer`: whose
    profile wrote them (None: judged by the Salt configuration directory they use)."""
    config_dir = next((d for d in SALT_CONFIG_DIRS
                       if any(p.startswith(f"{d}/minion.d/") for p in files)), SALT_CONFIG_DIRS[0])
    minion_d = {Path(p).name: text for p, text in files.items()
                if p.startswith(f"{config_dir}/minion.d/")}
    config = yaml.safe_load(minion_d.get(STORE_CONF, "")) or {}
    grains = dict(config.get("grains") or {})
    extmods_dir = str(config.get("extension_modules") or DEFAULT_EXTMODS).rstrip("/") + "/"
    if installer is None:
        installer = "agama" if config_dir == BUNDLE_CONFIG_DIR else "autoyast"
    return InstalledMinion(
        config_dir=config_dir,
        minion_id=files.get(f"{config_dir}/minion_id", "").strip() or fallback_id,
        platform=str(grains.get(STORE_PLATFORM_GRAIN) or INSTALLER_PLATFORM[installer]),
        minion_d=minion_d, grains=grains,
        extmods={p: text for p, text in files.items()
                 if p.startswith(extmods_dir) and not p.endswith("/")})
