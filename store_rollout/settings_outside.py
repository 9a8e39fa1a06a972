"""Settings read outside a flow run: the Prefect server of the settings file (for the CLI), and
single settings `prefect-setup` needs where the others may not be given."""

from __future__ import annotations

import os
from typing import Annotated, Any

from dotenv import dotenv_values
from pydantic import TypeAdapter, ValidationError

from store_rollout.settings import RolloutSettings, SettingsError, load_settings, settings_file


def prefect_settings_of_file(environ: dict[str, str] | None = None) -> dict[str, str]:
    """PREFECT_API_URL and PREFECT_HOME of the settings file (the Prefect server its flows use),
    for the CLI to apply; the environment's own win, none apply when it sets PREFECT_API_URL."""
    env = os.environ if environ is None else environ
    path = settings_file(dict(env))
    if path is None or "PREFECT_API_URL" in env or not path.is_file():
        return {}
    given = dotenv_values(path)
    return {name: env.get(name) or str(given[name]) for name in ("PREFECT_API_URL", "PREFECT_HOME")
            if given.get(name)}


def setting_at_setup(name: str, environ: dict[str, str] | None = None) -> Any:
    """One setting for `prefect-setup`, which may run where the others are not given: from the
    settings if they load, else its own variable, else its default."""
    try:
        return getattr(load_settings(environ), name)
    except SettingsError:
        field = RolloutSettings.model_fields[name]
        given = (os.environ if environ is None else environ).get(f"STORE_ROLLOUT_{name.upper()}")
        if given is None:
            return field.get_default(call_default_factory=True)
        typed: Any = Annotated[field.annotation, *field.metadata]
        try:
            return TypeAdapter(typed).validate_python(given)
        except ValidationError as exc:
            raise SettingsError(f"STORE_ROLLOUT_{name.upper()}={given!r}: "
                                f"{exc.errors()[0]['msg']}") from None
