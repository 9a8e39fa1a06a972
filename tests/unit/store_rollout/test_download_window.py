"""The download window's decision: inside it staging goes, outside it waits for the next
opening (in the store's zone), a malformed window fails closed naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from store_rollout.download_window import download_decision

FIELD = "stores[12].download_window"
BERLIN = "Europe/Berlin"


def test_inside_the_window_staging_goes() -> None:
    now = datetime(2026, 11, 28, 1, 30, tzinfo=UTC)  # 02:30 in Berlin
    decision = download_decision(FIELD, BERLIN, ["daily 00:00-06:00"], now)
    assert decision.go and decision.wait_until is None


def test_outside_the_window_staging_waits_for_its_next_opening() -> None:
    now = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)  # 10:00 in Berlin, a Saturday
    decision = download_decision(FIELD, BERLIN, ["daily 00:00-06:00"], now)
    assert not decision.go
    assert decision.wait_until == datetime(2026, 11, 28, 23, 0, tzinfo=UTC)  # 00:00 local


def test_no_window_set_means_any_time() -> None:
    assert download_decision(FIELD, BERLIN, None, datetime.now(UTC)).go


@pytest.mark.parametrize("windows, says", [
    (["nightly 00:00-06:00"], "'nightly 00:00-06:00' is not a window"),
    (["daily 25:00-06:00"], "is not a window"),
    ([], "empty"),
])
def test_a_malformed_window_fails_closed_naming_the_field(windows: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=rf"^stores\[12\]\.download_window: .*{says}"):
        download_decision(FIELD, BERLIN, windows, datetime.now(UTC))


def test_an_unknown_zone_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"^stores\[12\]\.download_window: unknown"):
        download_decision(FIELD, "Mars/Olympus", ["daily 00:00-06:00"], datetime.now(UTC))
