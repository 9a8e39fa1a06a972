"""Staging waits for the store's download window (tasks/download_window.py): at once inside it
or with none set, until its opening outside it, refused without a time zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from store_rollout.download_window import download_decision
from store_rollout.inventory import Store, parse_inventory
from store_rollout.settings import RolloutSettings
from store_rollout.settings_parts import ImageSettings
from tasks.download_window import wait_for_download_window

NIGHT = datetime(2026, 11, 28, 2, 0, tzinfo=UTC)  # 02:00 UTC; the window opens at 08:00
DAY = ["daily 08:00-18:00"]


def images(**extra: Any) -> ImageSettings:
    base = {"image_description": "d", "image_cache_dir": "/c", "image_params": {},
            "image_base_url": "https://img.invalid"}
    return ImageSettings.model_validate({**base, **extra})


def store(**calendar: Any) -> Store:
    return parse_inventory({"stores": [{
        "store_id": "dw1", **({"calendar": calendar} if calendar else {}),
        "hypervisor": {"hostname": "hv-dw1.invalid", "mac": "52:54:00:49:dd:01"},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "DE-DW1"}}]}).stores[0]


class Clock:
    """The clock tasks/windows.py reads, moved on by its sleeps."""

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.slept: list[float] = []

    def now(self, tz: Any = None) -> datetime:
        return self.at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.at += timedelta(seconds=seconds)


def test_no_window_set_stages_at_once() -> None:
    clock = Clock(NIGHT)
    assert "any time" in wait_for_download_window(store(), images(), clock.sleep, clock.now)
    assert clock.slept == []


def test_outside_the_window_it_waits_until_its_opening(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(NIGHT)
    monkeypatch.setattr("tasks.windows.datetime", clock)
    said: list[str] = []
    messages: list[str] = []
    monkeypatch.setattr("tasks.windows.say_running", lambda name, message: said.append(name)
                        or messages.append(message))
    settings = images(download_window=DAY, default_time_zone="UTC")
    went = wait_for_download_window(store(), settings, clock.sleep, clock.now)
    assert went.startswith("waited: outside the download window")
    assert clock.at == datetime(2026, 11, 28, 8, 0, tzinfo=UTC)  # woke at the opening, not later
    assert sum(clock.slept) == 6 * 3600 and max(clock.slept) <= 30
    assert said == ["AwaitingWindow", "Running"]  # the run said it waits, then that it goes on
    assert "in its download window since 08:00 UTC" in messages[-1]  # not "maintenance"
    assert "in the download window" in wait_for_download_window(store(), settings, clock.sleep,
                                                                clock.now)


def test_the_stores_own_time_zone_decides() -> None:
    # 09:00 UTC is 18:00 in Tokyo: outside a Tokyo store's 08:00-18:00, inside a UTC one's
    at = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)
    tokyo = store(time_zone="Asia/Tokyo", windows=["daily 00:00-24:00"])
    assert tokyo.calendar is not None and tokyo.calendar.time_zone == "Asia/Tokyo"
    assert not download_decision("download_window", "Asia/Tokyo", DAY, at).go
    assert download_decision("download_window", "UTC", DAY, at).go


def test_a_window_without_a_time_zone_is_refused_naming_the_fields() -> None:
    with pytest.raises(ValueError, match="calendar.time_zone or STORE_ROLLOUT_DEFAULT_TIME_ZONE"):
        wait_for_download_window(store(), images(download_window=DAY), lambda s: None,
                                 lambda: NIGHT)


def test_a_malformed_download_window_fails_at_load_naming_the_field() -> None:
    with pytest.raises(ValueError, match="download_window: 'nightly' is not a window"):
        RolloutSettings(download_window=["nightly"])  # type: ignore[call-arg]
