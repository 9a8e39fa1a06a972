"""Offline-first runs (issue 49): how long a run waits for a store whose link went silent.
Part of the settings (store_rollout/settings.py); the wait is tasks/store_link.py."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

# an hour: a DSL or LTE line that drops is usually back within minutes, a router's reboot or a
# provider's night work within the hour; longer than that, a person should look at the store
DEFAULT_STORE_LINK_WAIT_SECONDS = 3600.0


class LinkSettings(BaseSettings):
    # past step 5 a silent store is waited for (its run says "store link down since ..."), never
    # failed at once nor taken for absent; past this bound the run fails naming the silence
    store_link_wait_seconds: float = Field(
        DEFAULT_STORE_LINK_WAIT_SECONDS, ge=30, le=7 * 86400,
        description="seconds a run waits for a store whose minions went silent after step 5 "
        "(its link down) before it fails naming the silence")
