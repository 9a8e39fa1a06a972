"""The chain's default calendar, part of the settings (store_rollout/settings.py): a store
whose inventory row gives no calendar (blank cells, `calendar: null`) follows it; without
either, disruptive steps are refused (fail closed), never run "any time"."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode

from store_rollout.inventory.calendar_spec import CalendarSpec


class DefaultCalendarSettings(BaseSettings):
    # the chain's default calendar (store_rollout/inventory/calendar_spec.py): a store whose
    # inventory row gives none (blank cells, `calendar: null`) follows it; without either,
    # disruptive steps are refused (fail closed), never run "any time"
    default_time_zone: str = Field("", description="IANA zone of the default calendar, e.g. "
                                   "Europe/Berlin")
    default_maintenance_windows: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description='default windows, ";"-separated, e.g. '
                                          '"Mon-Sat 22:00-06:00; Sun 00:00-24:00"')
    default_blackout_dates: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description='default blackout dates, ";"-separated')

    @field_validator("default_maintenance_windows", "default_blackout_dates", mode="before")
    @classmethod
    def _entries(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [entry.strip() for entry in value.split(";") if entry.strip()]
        return value

    @field_validator("default_blackout_dates")
    @classmethod
    def _default_calendar(cls, value: list[str], info: ValidationInfo) -> list[str]:
        zone, windows = info.data.get("default_time_zone"), info.data.get("default_maintenance_windows")
        if zone or windows or value:
            if not zone or not windows:
                raise ValueError("the default calendar needs both STORE_ROLLOUT_DEFAULT_TIME_ZONE "
                                 "and STORE_ROLLOUT_DEFAULT_MAINTENANCE_WINDOWS (or neither)")
            CalendarSpec(time_zone=zone, windows=windows, blackout=value or None)
        return value

    @property
    def default_calendar(self) -> CalendarSpec | None:
        """The chain's default calendar, or None (disruptive steps of a store without its own
        calendar are then refused)."""
        if not self.default_time_zone:
            return None
        return CalendarSpec(time_zone=self.default_time_zone,
                            windows=self.default_maintenance_windows,
                            blackout=self.default_blackout_dates or None)
