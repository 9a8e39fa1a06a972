"""Issue 30, the store calendar: windows in the store's own time (store_rollout/calendar.py), and
the inventory's `calendar:` (YAML, CSV, defaults per inventory, errors naming store and field)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from store_rollout import calendar
from store_rollout.inventory import InventoryError, load_inventory, parse_inventory


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_an_overnight_window_across_a_dst_night_is_as_long_as_the_wall_clock_says() -> None:
    # New York: clocks go forward on 2026-03-08 and back on 2026-11-01, both at 02:00
    spring = calendar.next_windows("America/New_York", ["daily 22:00-06:00"], [],
                                   utc(2026, 3, 6, 12), 3)
    assert [w.hours for w in spring] == [8, 7, 8]
    assert [(w.local(w.start).hour, w.local(w.end).hour) for w in spring] == [(22, 6)] * 3
    autumn = calendar.next_windows("America/New_York", ["Sat 22:00-06:00"], [],
                                   utc(2026, 10, 30), 1)
    assert autumn[0].hours == 9
    assert (autumn[0].start, autumn[0].end) == (utc(2026, 11, 1, 2), utc(2026, 11, 1, 11))


def test_the_same_local_window_is_at_different_utc_times_per_zone() -> None:
    after = utc(2026, 6, 1, 12)  # a Monday
    starts = {tz: calendar.next_windows(tz, ["Mon-Sat 22:00-06:00"], [], after, 1)[0].start
              for tz in ("Asia/Tokyo", "Europe/Berlin", "America/New_York")}
    assert starts == {"Asia/Tokyo": utc(2026, 6, 1, 13), "Europe/Berlin": utc(2026, 6, 1, 20),
                      "America/New_York": utc(2026, 6, 2, 2)}


def test_a_window_open_now_comes_first_and_weekdays_and_lists_are_honoured() -> None:
    # Tokyo 2026-11-27 03:00 (a Friday) is inside "daily 02:00-04:00"
    now = utc(2026, 11, 26, 18)
    first = calendar.next_windows("Asia/Tokyo", ["daily 02:00-04:00"], [], now, 1)[0]
    assert first.contains(now) and first.start == utc(2026, 11, 26, 17)
    days = calendar.next_windows("Europe/Berlin", ["Mon,Wed 10:00-11:00", "Fri-Sun 09:00-09:30"],
                                 [], utc(2026, 6, 1), 6)  # Monday 1 June
    assert [w.local(w.start).strftime("%a %H:%M") for w in days] == [
        "Mon 10:00", "Wed 10:00", "Fri 09:00", "Sat 09:00", "Sun 09:00", "Mon 10:00"]


def test_windows_that_touch_merge_and_blackout_days_cut_them() -> None:
    merged = calendar.next_windows("Europe/Berlin", ["Sat 22:00-06:00", "Sun 00:00-24:00"], [],
                                   utc(2026, 6, 1), 1)[0]
    assert (merged.local(merged.start).strftime("%a %H:%M"),
            merged.local(merged.end).strftime("%a %H:%M")) == ("Sat 22:00", "Mon 00:00")
    cut = calendar.next_windows("Europe/Berlin", ["daily 22:00-06:00"],
                                ["2026-12-24", "2026-12-26..2026-12-27"], utc(2026, 12, 23, 12), 4)
    assert [(w.local(w.start).strftime("%d %H:%M"), w.local(w.end).strftime("%d %H:%M"))
            for w in cut] == [("23 22:00", "24 00:00"), ("25 00:00", "25 06:00"),
                              ("25 22:00", "26 00:00"), ("28 00:00", "28 06:00")]


def test_a_calendar_blacked_out_past_the_horizon_has_no_window() -> None:
    assert calendar.next_windows("Europe/Berlin", ["daily 22:00-06:00"],
                                 ["2026-01-01..2028-12-31"], utc(2026, 6, 1), 3) == []


@pytest.mark.parametrize(("text", "message"), [
    ("Mon 25:00-01:00", "invalid maintenance window 'Mon 25:00-01:00': write days"),
    ("Xyz 10:00-11:00", "invalid maintenance window"),
    ("Mon-Sat", "invalid maintenance window"),
    ("Mon 10:00-10:00", "is empty (it starts when it ends): give it a length, e.g. Mon 10:00-12:00"),
])
def test_malformed_windows_are_refused_saying_how_to_write_them(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        calendar.parse_window(text)


def test_a_wrapping_day_range_and_bad_blackouts() -> None:
    assert calendar.parse_window("Fri-Mon 23:00-01:00").weekdays == (0, 4, 5, 6)
    with pytest.raises(ValueError, match="invalid blackout date '2026-02-30'"):
        calendar.parse_blackout("2026-02-30")
    with pytest.raises(ValueError, match="ends before it starts"):
        calendar.parse_blackout("2026-12-31..2026-12-01")
    with pytest.raises(ValueError, match="unknown or non-canonical time zone "
                                         "'Europe/Springfield': use the IANA name"):
        calendar.zone("Europe/Springfield")


STORE = {"hypervisor": {"hostname": "hv.example", "mac": "52:54:00:00:00:01"},
         "erp": {"site_code": "S1"}}


def inventory(stores: list[dict[str, object]], defaults: dict[str, object] | None = None) -> dict[
        str, object]:
    raw: dict[str, object] = {"stores": [
        {**STORE, "store_id": f"s{n}", **s,
         "hypervisor": {"hostname": f"hv{n}.example", "mac": f"52:54:00:00:00:{n:02x}"}}
        for n, s in enumerate(stores, start=1)]}
    if defaults is not None:
        raw["defaults"] = defaults
    return raw


def test_defaults_fill_each_store_field_by_field_and_a_store_overrides_them() -> None:
    inv = parse_inventory(inventory(
        [{}, {"calendar": {"time_zone": "Asia/Tokyo"}}, {"calendar": {"windows": ["Sun 01:00-05:00"]}}],
        {"calendar": {"time_zone": "Europe/Berlin", "windows": ["Mon-Sat 22:00-06:00"],
                      "blackout": ["2026-12-24"]}}))
    cals = {s.store_id: s.calendar for s in inv.stores}
    assert cals["s1"] is not None and cals["s1"].time_zone == "Europe/Berlin"
    assert cals["s2"] is not None and (cals["s2"].time_zone, cals["s2"].windows) == (
        "Asia/Tokyo", ["Mon-Sat 22:00-06:00"])
    assert cals["s3"] is not None and (cals["s3"].time_zone, cals["s3"].windows,
                                       cals["s3"].blackout) == (
        "Europe/Berlin", ["Sun 01:00-05:00"], ["2026-12-24"])
    assert parse_inventory(inventory([{}])).stores[0].calendar is None  # none: any time


@pytest.mark.parametrize(("stores", "defaults", "message"), [
    ([{"calendar": {"time_zone": "Mars/Olympus", "windows": ["daily 01:00-02:00"]}}], None,
     "store 's1': calendar.time_zone: unknown or non-canonical time zone 'Mars/Olympus'"),
    ([{"calendar": {"time_zone": "UTC", "windows": ["Mon 1:00-2:00"]}}], None,
     "store 's1': calendar.windows: invalid maintenance window 'Mon 1:00-2:00'"),
    ([{"calendar": {"time_zone": "UTC", "windows": []}}], None,
     "store 's1': calendar.windows: no maintenance window: give at least one"),
    ([{"calendar": {"windows": ["daily 01:00-02:00"]}}], None,
     "store 's1': calendar: calendar.time_zone missing: set it for the store or in defaults.calendar"),
    ([{}, {}], {"calendar": {"time_zone": "Europe/Berlin", "windows": ["daily 25:00-02:00"]}},
     "defaults.calendar.windows: invalid maintenance window 'daily 25:00-02:00'"),
    ([{"calendar": {"time_zone": "UTC", "windows": ["daily 01:00-02:00"],
                    "blackout": ["24.12.2026"]}}], None,
     "store 's1': calendar.blackout: invalid blackout date '24.12.2026'"),
])
def test_bad_calendars_are_refused_naming_store_and_field(
        stores: list[dict[str, object]], defaults: dict[str, object] | None, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(inventory(stores, defaults))
    assert message in str(err.value)
    assert str(err.value).count("defaults.calendar.windows") <= 1  # said once, not per store


def test_csv_columns_carry_the_calendar(tmp_path: Path) -> None:
    path = tmp_path / "stores.csv"
    path.write_text(
        "store_id,hv_hostname,hv_mac,erp_site_code,time_zone,maintenance_windows,blackout_dates\n"
        's1,hv1.example,52:54:00:00:00:01,S1,America/New_York,"Mon-Fri 22:00-05:00; Sun 00:00-24:00",'
        "2026-11-26..2026-11-27\n")
    cal = load_inventory(path).stores[0].calendar
    assert cal is not None
    assert (cal.time_zone, cal.windows, cal.blackout) == (
        "America/New_York", ["Mon-Fri 22:00-05:00", "Sun 00:00-24:00"], ["2026-11-26..2026-11-27"])
    # Wednesday's window is cut at midnight, Thursday 26 is blacked out
    first = cal.next_windows(utc(2026, 11, 25, 12), 1)[0]
    assert (first.start, first.end) == (utc(2026, 11, 26, 3), utc(2026, 11, 26, 5))


def test_windows_are_continuous_across_a_long_search() -> None:
    found = calendar.next_windows("Europe/Berlin", ["Mon 01:00-02:00"], [], utc(2026, 1, 1), 50)
    assert len(found) == 50  # found in 35-day steps, none lost or repeated at a step's edge
    assert all(b.start - a.start in (timedelta(days=7), timedelta(days=7, hours=1),
                                     timedelta(days=7, hours=-1))
               for a, b in zip(found, found[1:], strict=False))


def test_the_windows_command_prints_each_stores_windows(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from app.cli import app

    raw = inventory([{}, {"calendar": {"time_zone": "Asia/Tokyo"}}],
                    {"calendar": {"time_zone": "Europe/Berlin", "windows": ["daily 22:00-06:00"]}})
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    runner = CliRunner()
    shown = runner.invoke(app, ["windows", "--inventory", str(path), "--count", "2", "--json"])
    assert shown.exit_code == 0, shown.output
    found = {sid: shown["windows"] for sid, shown in json.loads(shown.stdout).items()}
    assert [len(found[s]) for s in ("s1", "s2")] == [2, 2]
    assert [w["time_zone"] for w in found["s2"]] == ["Asia/Tokyo"] * 2
    assert all(w["start_local"][11:16] == "22:00" for w in found["s1"] + found["s2"])
    table = runner.invoke(app, ["windows", "s2", "--inventory", str(path)])
    assert table.exit_code == 0 and "Asia/Tokyo" in table.output and "JST" in table.output
    plain = tmp_path / "plain.yaml"  # no calendar, no defaults: none (refused), not any time
    plain.write_text(json.dumps(inventory([{}])))
    none = runner.invoke(app, ["windows", "--inventory", str(plain), "--json"], env={
        "STORE_ROLLOUT_SETTINGS_FILE": ""})
    assert json.loads(none.stdout) == {"s1": None}
    table = runner.invoke(app, ["windows", "--inventory", str(plain)], env={
        "STORE_ROLLOUT_SETTINGS_FILE": ""})
    assert "no calendar and no default one" in " ".join(table.stdout.split())
    unknown = runner.invoke(app, ["windows", "s9", "--inventory", str(path)])
    assert unknown.exit_code != 0 and "store_id 's9' is not in the inventory" in unknown.output


@pytest.mark.parametrize("name", ["localtime", "Factory", "EST", "US/Eastern", "posixrules",
                                  "Etc/GMT+5"])
def test_only_canonical_zones_are_taken(name: str) -> None:
    """Names that follow a machine's setting or an old convention, not a place's clocks."""
    with pytest.raises(ValueError, match=re.escape(f"non-canonical time zone {name!r}")):
        calendar.zone(name)
    assert calendar.zone("UTC").key == "UTC"
    assert calendar.zone("America/Argentina/Buenos_Aires").key == "America/Argentina/Buenos_Aires"


def test_a_window_in_the_hour_the_clocks_skip_lasts_0_h_and_is_shown_skipped(
        tmp_path: Path) -> None:
    """Europe/Berlin goes from 02:00 to 03:00 on 2027-03-28: "Sun 02:00-03:00" is 0 h that
    night. No window is offered then; `windows` shows it, skipped."""
    import json

    from typer.testing import CliRunner

    from app.cli import app

    since, until = datetime(2027, 3, 20, tzinfo=UTC), datetime(2027, 4, 10, tzinfo=UTC)
    found = calendar.windows_between("Europe/Berlin", ["Sun 02:00-03:00"], [], since, until)
    assert [f"{w.start:%m-%d}" for w in found] == ["03-21", "04-04"]  # 03-28 is not offered
    skipped = calendar.empty_windows_between("Europe/Berlin", ["Sun 02:00-03:00"], since, until)
    assert skipped == [(datetime(2027, 3, 28, 1, 0, tzinfo=UTC), "Sun 02:00-03:00")]
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inventory([{"calendar": {
        "time_zone": "Europe/Berlin", "windows": ["Sun 02:00-03:00"],
        "blackout": [f"{datetime.now(UTC):%Y-%m-%d}..2027-03-27"]}}])))
    shown = CliRunner().invoke(app, ["windows", "--inventory", str(path), "--count", "1"])
    text = " ".join(shown.stdout.split())
    assert "Sun 2027-03-28: Sun 02:00-03:00" in text and "skipped: the clocks go forward" in text
