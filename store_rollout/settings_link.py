"""Offline-first runs (issue 49): how long a run waits for a store whose link went silent.
Part of the settings (store_rollout/settings.py); the wait is tasks/store_link.py."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from store_rollout.download_window import checked_download_window

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
    # staging (stage-images, an update's staging, a refresh's) moves image bytes only in this
    # window, in each store's time zone; the switch stays in the maintenance window. None: any
    # time (as before)
    download_window: list[str] | None = Field(
        None, description='windows in which staging may download, e.g. ["daily 08:00-18:00"], '
        "in the store's time zone, at image_rate_limit; unset: any time")

    @field_validator("download_window")
    @classmethod
    def _download_window(cls, value: list[str] | None) -> list[str] | None:
        # the format now (fail closed before any run); each store's zone at staging
        return None if value is None else checked_download_window("download_window", "UTC", value)
