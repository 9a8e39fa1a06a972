"""Settings read outside a flow run: the Prefect server of the settings file (for the CLI), and
single settings read alone where the others may not be given (`prefect-setup`, heartbeats)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any

from dotenv import dotenv_values
from pydantic import TypeAdapter, ValidationError

from store_rollout.settings import RolloutSettings, SettingsError, settings_file
from store_rollout.settings_guard import region_settings

# a file holding the Prefect API's `user:password` (PREFECT_API_AUTH_STRING), mode 0600: the
# settings file names it and holds no secret itself (an API behind
# PREFECT_SERVER_API_AUTH_STRING; docs/production.md)
PREFECT_AUTH_FILE_ENV = "STORE_ROLLOUT_PREFECT_AUTH_FILE"
# what the settings file gives a Prefect client besides the credential
_PREFECT_NAMES = ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_API_SSL_CERT_FILE")


def prefect_settings_of_file(environ: dict[str, str] | None = None) -> dict[str, str]:
    """PREFECT_API_URL, PREFECT_HOME and PREFECT_API_SSL_CERT_FILE of the settings file (the
    Prefect server its flows use), for the CLI to apply; the environment's own win, none apply
    when it sets PREFECT_API_URL. PREFECT_API_AUTH_STRING comes from the file that
    STORE_ROLLOUT_PREFECT_AUTH_FILE names (environment first, then the settings file) unless
    the environment sets it."""
    env = os.environ if environ is None else environ
    path = settings_file(dict(env))
    given = dotenv_values(path) if path is not None and path.is_file() else {}
    found: dict[str, str] = {}
    if "PREFECT_API_URL" not in env:
        found = {name: env.get(name) or str(given[name]) for name in _PREFECT_NAMES
                 if given.get(name)}
    auth_file = env.get(PREFECT_AUTH_FILE_ENV) or given.get(PREFECT_AUTH_FILE_ENV)
    if auth_file and "PREFECT_API_AUTH_STRING" not in env:
        found["PREFECT_API_AUTH_STRING"] = prefect_auth_string(Path(auth_file))
    return found


def prefect_auth_string(path: Path) -> str:
    """The `user:password` a Prefect auth file holds; only its owner may read the file."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{PREFECT_AUTH_FILE_ENV}={path}: cannot read it ({exc.strerror}); "
                            "name the file of the Prefect API's user:password") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SettingsError(f"{PREFECT_AUTH_FILE_ENV}={path}: mode {stat.filemode(mode)} lets "
                            f"others read the Prefect API credential; chmod 600 {path}")
    if ":" not in text:
        raise SettingsError(f"{PREFECT_AUTH_FILE_ENV}={path}: not a user:password line; write "
                            "the Prefect server's PREFECT_SERVER_API_AUTH_STRING into it")
    return text


def one_setting(name: str, environ: dict[str, str] | None = None) -> Any:
    """One setting read alone, without loading (or requiring) the others: from the same sources
    and in the same order as load_settings (its region's value, its variable in the environment,
    then in the settings file, its default), checked as load_settings checks it. For what runs
    where the other settings may be missing: `prefect-setup`, and each flow run's heartbeat,
    which starts before the flow loads its settings (tasks/run_health.beating)."""
    env = dict(os.environ if environ is None else environ)
    path = settings_file(env)
    given = dotenv_values(path) if path is not None and path.is_file() else {}
    variable = f"STORE_ROLLOUT_{name.upper()}"
    value = region_settings(env, path).get(name, env.get(variable, given.get(variable)))
    field = RolloutSettings.model_fields[name]
    if value is None:
        return field.get_default(call_default_factory=True)
    # its constraints (ge, le, a pattern) as load_settings checks them; a plain field has none
    typed: Any = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
    try:
        return TypeAdapter(typed).validate_python(value)
    except ValidationError as exc:
        raise SettingsError(f"{variable}={value!r}: {exc.errors()[0]['msg']}") from None
