"""What load_settings (store_rollout/settings.py) refuses before reading a value: retired
settings, a secret given in the environment or the settings file (secrets live in Prefect
Blocks only; the settings may name the Block), and a settings file others may read."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from store_rollout.regions import DEFAULT_REGION, RegionsError, load_regions

# settings an older release read; set now, they would be ignored (a BMC password among them)
RETIRED = ("STORE_ROLLOUT_POWER_USER", "STORE_ROLLOUT_POWER_PASSWORD",
           "STORE_ROLLOUT_POWER_PASSWORD_BLOCK", "STORE_ROLLOUT_POWER_ADDRESS")
# secrets an older release read from the environment or the settings file: now each only from
# a Block, named by the setting that says where it is (the Credentials Block, or a Secret block)
SECRETS = {"STORE_ROLLOUT_COBBLER_PASSWORD": (
               "a Cobbler Credentials Block", "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK",
               "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK"),
           "STORE_ROLLOUT_ERP_TOKEN": (
               "an ERP Credentials Block", "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK",
               "STORE_ROLLOUT_ERP_TOKEN_BLOCK"),
           # SLES's registration code: never a setting (store_rollout/platforms.py)
           "STORE_ROLLOUT_REGISTRATION_CODE": (
               "a Prefect Secret block", "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK",
               "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK")}


class SettingsError(ValueError):
    """Settings are missing or invalid; the message names the field and where to set it.

    `missing`: the environment variables of the required settings nobody set; `brief`: all of it
    in one line for a person at a terminal (the message, for logs, has each field's detail)."""

    def __init__(self, message: str, missing: tuple[str, ...] = (), brief: str = "") -> None:
        super().__init__(message)
        self.missing = missing
        self.brief = brief or message


def refuse_unsafe(env: dict[str, str], path: Path | None) -> None:
    """A settings file others may read, a retired setting or a secret in the environment or
    the file: SettingsError, one line naming it and the fix, the secret's value never."""
    if path is not None:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise SettingsError(f"{path}: the settings file is readable by others (mode "
                                f"{mode:03o}): run `chmod 600 {path}`")
    given = dotenv_values(path) if path is not None else {}
    for name, (block, credentials, secret_block) in SECRETS.items():
        where = ("the environment" if env.get(name) else f"{path}" if given.get(name) else None)
        if where:
            raise SettingsError(
                f"{name} (in {where}): secrets are not read from the environment or a settings "
                f"file: save it in {block} and set {credentials} to the block name (or in a "
                f"Prefect Secret block named by {secret_block}), then remove {name}")
    retired = sorted(k for k in RETIRED if k in env)
    retired += sorted(f"{k} (in {path})" for k in given if k in RETIRED)
    if retired:
        raise SettingsError(
            f"{', '.join(retired)}: no longer read. A BMC login lives only in a BMC Credentials "
            "Block (name it in STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK, or per store in "
            "hypervisor.bmc_credentials_block) and a BMC's address in the inventory "
            "(hypervisor.power_address); remove these variables")


def region_settings(env: dict[str, str], path: Path | None) -> dict[str, Any]:
    """The settings the regions file gives this process's region (STORE_ROLLOUT_REGION)."""
    given = dotenv_values(path) if path is not None else {}

    def setting(name: str) -> str:
        variable = f"STORE_ROLLOUT_{name.upper()}"
        return env.get(variable) or given.get(variable) or ""

    try:
        regions = load_regions(setting("regions_file"))
        region = setting("region") or DEFAULT_REGION
        return dict(regions.spec(region, "region (STORE_ROLLOUT_REGION)").settings)
    except RegionsError as exc:
        raise SettingsError(str(exc)) from None
