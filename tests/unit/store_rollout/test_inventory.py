"""The inventory's host addressing is checked as one network; files as a store technician saves
them are read or refused naming the fix (no lab needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from store_rollout.inventory import InventoryError, load_inventory, parse_inventory
from store_rollout.inventory.replacement import with_new_box


def inventory(**hypervisor: str) -> dict[str, Any]:
    return {"stores": [{"store_id": "s1", "erp": {"site_code": "S1"},
                        "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01",
                                       **hypervisor}}]}


@pytest.mark.parametrize(("hypervisor", "message"), [
    ({"ip": "192.0.2.11"}, "ip 192.0.2.11 without a netmask"),
    ({"ip": "192.0.2.11", "netmask": "255.0.255.0"}, "netmask 255.0.255.0 is not a network mask"),
    ({"ip": "192.0.2.0", "netmask": "255.255.255.0"},
     "ip 192.0.2.0 is the network address of 192.0.2.0/24"),
    ({"ip": "192.0.2.255", "netmask": "255.255.255.0"},
     "ip 192.0.2.255 is the broadcast address of 192.0.2.0/24"),
    ({"ip": "192.0.2.11", "netmask": "255.255.255.0", "gateway": "192.0.3.1"},
     "gateway 192.0.3.1 is outside the host's network (ip 192.0.2.11, netmask 255.255.255.0: "
     "network 192.0.2.0/24)"),
    ({"ip": "192.0.2.11", "netmask": "255.255.255.0", "gateway": "192.0.2.11"},
     "gateway 192.0.2.11 is the host's own ip"),
    ({"ip": "192.0.2.11", "netmask": "255.255.255.0", "gateway": "192.0.2.255"},
     "gateway 192.0.2.255 is not a host address"),
    ({"netmask": "255.255.255.0"}, "netmask 255.255.255.0 given for a DHCP host (ip: dhcp): remove it"),
    ({"ip": "dhcp", "netmask": "255.255.255.0", "gateway": "192.0.2.1"},
     "netmask 255.255.255.0 and gateway 192.0.2.1 given for a DHCP host (ip: dhcp): remove them"),
])
def test_addressing_refused_with_store_fields_and_fix(hypervisor: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(inventory(**hypervisor), "inv.yaml")
    assert str(err.value).startswith("inv.yaml: store 's1': hypervisor: ")
    assert message in str(err.value)


@pytest.mark.parametrize("hypervisor", [
    {},
    {"ip": "dhcp"},
    {"ip": "192.0.2.11", "netmask": "255.255.255.0"},
    {"ip": "192.0.2.11", "netmask": "255.255.255.0", "gateway": "192.0.2.1"},
    {"ip": "10.20.30.40", "netmask": "255.255.0.0", "gateway": "10.20.0.1"},
    {"ip": "192.0.2.1", "netmask": "255.255.255.254", "gateway": "192.0.2.0"},  # RFC 3021 /31
])
def test_consistent_addressing_accepted(hypervisor: dict[str, str]) -> None:
    store = parse_inventory(inventory(**hypervisor)).get("s1")
    assert store.hypervisor.ip == hypervisor.get("ip", "dhcp")


def test_a_store_given_twice_is_refused_naming_it() -> None:
    inv = parse_inventory({"stores": [inventory()["stores"][0],
                                      {**inventory()["stores"][0], "store_id": "s2",
                                       "hypervisor": {"hostname": "hv-s2.example",
                                                      "mac": "52:54:00:00:00:02"}}]})
    assert [s.store_id for s in inv.select(["s2", "s1"])] == ["s2", "s1"]
    with pytest.raises(InventoryError, match="store_ids: 's1' given more than once"):
        inv.select(["s1", "s2", "s1"])


@pytest.mark.parametrize(("mac", "message"), [
    ("00:00:00:00:00:00", "MAC '00:00:00:00:00:00' is all zeros"),
    ("00-00-00-00-00-00", "MAC '00-00-00-00-00-00' is all zeros"),
    ("FF:FF:FF:FF:FF:FF", "MAC 'FF:FF:FF:FF:FF:FF' is the broadcast address"),
    ("01:00:5e:00:00:01", "MAC '01:00:5e:00:00:01' is a multicast address (the low bit of its "
                          "first octet is set"),
    ("33:33:00:00:00:01", "MAC '33:33:00:00:00:01' is a multicast address"),  # IPv6 multicast
])
def test_macs_no_nic_has_are_refused_naming_store_and_field(mac: str, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(inventory(mac=mac), "inv.yaml")
    assert str(err.value).startswith(f"inv.yaml: store 's1': hypervisor.mac: {message}")
    assert "use the" in str(err.value)  # the fix


CSV_HEADER = ["store_id", "hv_hostname", "hv_mac", "erp_site_code", "vm_disk_gib"]
CSV_ROWS = [["c1", "hv-c1.x.invalid", "52:54:00:c0:00:01", "C-1", "4"],
            ["c2", "hv-c2.x.invalid", "52:54:00:c0:00:02", "C-2", ""]]


def spreadsheet_csv(path: Path, delimiter: str, bom: bool = True, newline: str = "\r\n",
                    rows: list[list[str]] = CSV_ROWS) -> Path:
    """A CSV as a spreadsheet saves it: "CSV UTF-8" starts with a byte-order mark, lines end in
    CRLF, and ';' separates cells where ',' is the decimal separator."""
    text = newline.join(delimiter.join(cells) for cells in [CSV_HEADER, *rows]) + newline
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


@pytest.mark.parametrize("delimiter", [";", ",", "\t"])
def test_spreadsheet_csv_is_read(tmp_path: Path, delimiter: str) -> None:
    inv = load_inventory(spreadsheet_csv(tmp_path / "stores.csv", delimiter))
    assert [s.store_id for s in inv.stores] == ["c1", "c2"]  # not '\ufeffstore_id'
    assert inv.get("c1").hypervisor.mac == "52:54:00:c0:00:01"
    assert (inv.get("c1").vm.disk_gib, inv.get("c2").vm.disk_gib) == (4, 20)
    assert inv.get("c2").erp.site_code == "C-2"  # no '\r' left at the end of a line


def test_csv_carries_each_hosts_bmc(tmp_path: Path) -> None:
    path = tmp_path / "bmc.csv"
    path.write_text("store_id,hv_hostname,hv_mac,erp_site_code,hv_power_type,hv_power_address,"
                    "hv_power_port,hv_redfish_system_id,hv_bmc_credentials_block\n"
                    "b1,hv-b1.x.invalid,52:54:00:c1:00:01,B-1,ipmi,10.1.0.5,6230,,\n"
                    "b2,hv-b2.x.invalid,52:54:00:c1:00:02,B-2,redfish,https://bmc-b2,,1,bmc-b2\n")
    b1, b2 = (load_inventory(path).get(s).hypervisor for s in ("b1", "b2"))
    assert (b1.power_type, b1.power_address, b1.power_port, b1.redfish_system_id) == (
        "ipmi", "10.1.0.5", 6230, None)
    assert (b2.power_type, b2.power_address, b2.redfish_system_id, b2.bmc_credentials_block) == (
        "redfish", "https://bmc-b2", "1", "bmc-b2")
    path.write_text(path.read_text().replace(",ipmi,", ",ilo,"))
    with pytest.raises(InventoryError, match="store 'b1': hypervisor.power_type: Input should be "
                                             "'ipmi' or 'redfish'"):
        load_inventory(path)


def test_a_hosts_serial_is_read_checked_and_unique(tmp_path: Path) -> None:
    path = tmp_path / "serials.csv"
    path.write_text("store_id,hv_hostname,hv_mac,erp_site_code,hv_serial\n"
                    "s1,hv-s1.x.invalid,52:54:00:c1:00:01,S-1,CZ2345ABC\n"
                    "s2,hv-s2.x.invalid,52:54:00:c1:00:02,S-2,\n")
    inv = load_inventory(path)
    assert (inv.get("s1").hypervisor.serial, inv.get("s2").hypervisor.serial) == ("CZ2345ABC", None)
    with pytest.raises(InventoryError, match="store 's1': hypervisor.serial: .*invalid serial "
                                             "number 'CZ 2345': the SMBIOS serial on the host's "
                                             "label"):
        parse_inventory(inventory(serial="CZ 2345"))
    path.write_text(path.read_text().replace("S-2,", "S-2,CZ2345ABC"))
    with pytest.raises(InventoryError, match="duplicate hypervisor.serial 'CZ2345ABC' in stores "
                                             "'s1' and 's2'"):
        load_inventory(path)


def test_a_new_box_is_checked_like_the_inventory_and_keeps_what_it_does_not_change() -> None:
    inv = parse_inventory({"stores": [
        inventory(power_address="10.1.0.5", serial="CZ1")["stores"][0],
        {**inventory()["stores"][0], "store_id": "s2",
         "hypervisor": {"hostname": "hv-s2.example", "mac": "52:54:00:00:00:02"}}]})
    moved = with_new_box(inv, "s1", {"mac": "52-54-00-00-00-0A", "power_port": 6230})
    hv = moved.hypervisor
    assert (hv.mac, hv.power_address, hv.power_port, hv.serial) == (
        "52:54:00:00:00:0a", "10.1.0.5", 6230, None)  # the old box's serial is not the new one's
    assert moved.hypervisor.hostname == "hv-s1.example" and moved.erp == inv.get("s1").erp
    for box, message in (
            ({"power_port": 1}, r"replace_box: mac missing \(store s1\); give the new "
                                r"box's mac"),
            ({"mac": "52:54:00:00:00:0a", "color": "red"}, "replace_box: unknown color"),
            ({"mac": "ff:ff:ff:ff:ff:ff"},
             "replace_box of store s1: hypervisor.mac: MAC 'ff:ff:ff:ff:ff:ff' is the broadcast"),
            ({"mac": "52:54:00:00:00:02"},
             "replace_box.mac 52:54:00:00:00:02: the MAC of store s2's host")):
        with pytest.raises(InventoryError, match=message):
            with_new_box(inv, "s1", box)


def test_a_refreshed_boxs_replacement_gets_an_id_of_its_own_mac() -> None:
    # a refreshed box signs in as store-<id>-hv-<its MAC's last 6 hex digits>; the box that
    # replaces it does too, so the inventory written back after the replacement loads
    raw = inventory(minion_id="store-s1-hv-000001")
    moved = with_new_box(parse_inventory(raw), "s1", {"mac": "52:54:00:ab:cd:ef"})
    assert moved.hypervisor_minion_id == "store-s1-hv-abcdef"
    raw["stores"][0]["hypervisor"].update(mac="52:54:00:ab:cd:ef", minion_id="store-s1-hv-abcdef")
    assert parse_inventory(raw).get("s1").hypervisor_minion_id == "store-s1-hv-abcdef"
    plain = with_new_box(parse_inventory(inventory()), "s1", {"mac": "52:54:00:ab:cd:ef"})
    assert plain.hypervisor_minion_id == "store-s1-hv"  # a box never refreshed keeps its id


def test_spreadsheet_leftovers_are_ignored_or_named(tmp_path: Path) -> None:
    # a cleared row stays behind as a row of empty cells; a formatted empty column as ';;'
    rows = [[*CSV_ROWS[0], "", ""], ["", "", "", "", "", "", ""]]
    path = spreadsheet_csv(tmp_path / "stores.csv", ";", rows=rows)
    path.write_bytes(path.read_bytes().replace(b"vm_disk_gib", b"vm_disk_gib;;", 1))
    assert [s.store_id for s in load_inventory(path).stores] == ["c1"]
    path.write_bytes(path.read_bytes().replace(b"4;;", b"4;;oops", 1))
    with pytest.raises(InventoryError, match=r"line 2: a value in column 7, which has no name"):
        load_inventory(path)
    spreadsheet_csv(path, ";", rows=[[*CSV_ROWS[0], "extra"]])
    with pytest.raises(InventoryError, match=r"line 2: 6 cells but the header names 5 columns "
                                             r"\(extra: \['extra'\]\)"):
        load_inventory(path)


def test_csv_with_another_delimiter_is_refused_naming_it(tmp_path: Path) -> None:
    path = spreadsheet_csv(tmp_path / "stores.csv", "|")
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert str(err.value).startswith(f"{path}: unknown CSV column(s) ['{'|'.join(CSV_HEADER)}'] "
                                     "(header split at ','; columns are separated by ',', ';' or "
                                     "tab): fix their names or the delimiter")


def test_csv_not_utf8_is_refused_naming_the_encoding_fix(tmp_path: Path) -> None:
    path = tmp_path / "stores.csv"  # Excel's plain "CSV" is the Windows code page
    path.write_bytes("store_id;erp_cost_center\nc1;Münster\n".encode("cp1252"))
    with pytest.raises(InventoryError, match=r"is not UTF-8 text \(byte 0xfc at offset 29\): save "
                                             r"it as UTF-8 \(in a spreadsheet: 'CSV UTF-8'\)"):
        load_inventory(path)


def test_directory_as_inventory_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path)
    assert str(err.value) == (f"inventory {tmp_path} is a directory: pass the inventory file in "
                              "it (.yaml, .yml or .csv), not the directory")


def test_unreadable_inventory_is_refused_naming_it(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = spreadsheet_csv(tmp_path / "stores.csv", ",")

    def denied(self: Path, *args: Any, **kwargs: Any) -> str:
        # chmod cannot show it: the tests run as root, who reads any file
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert str(err.value) == (f"inventory file {path} cannot be read (Permission denied): give "
                              "the user running store-rollout read access to it, or pass a "
                              "readable copy")


@pytest.mark.parametrize("command", [["rollout", "0001"], ["plan", "0001"], ["rollback", "0001"],
                                     ["vm-xml", "0001"]])
def test_cli_refuses_a_directory_in_one_line_without_traceback(tmp_path: Path,
                                                               command: list[str]) -> None:
    from app.cli import app

    result = CliRunner().invoke(app, [*command, "--inventory", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [f"error: inventory {tmp_path} is a directory: pass the "
                                          "inventory file in it (.yaml, .yml or .csv), not the "
                                          "directory"]


@pytest.mark.parametrize("command", [["rollout", "0001"], ["rollback", "0001"],
                                     ["decommission", "0001"], ["batch"], ["stage", "0001"],
                                     ["replace", "0001", "--mac", "52:54:00:00:00:99"]])
def test_a_command_that_changes_stores_names_its_inventory(command: list[str]) -> None:
    """Issue 43: no example inventory behind a command that changes anything (store ids like
    0001 look real): refused naming the option, before anything is read or asked."""
    from app.cli import app

    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "Missing option '--inventory'" in " ".join(result.output.split())


def test_rollback_and_decommission_show_what_they_would_do_without_yes(tmp_path: Path) -> None:
    from app.cli import app

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"stores": [{
        "store_id": "0001", "erp": {"site_code": "S1"},
        "hypervisor": {"hostname": "hv1.example", "mac": "52:54:00:00:00:01"}}]}))
    for command, says in (("rollback", "its system disk and its key (its data disk is kept"),
                          ("decommission", "destroys the store server and its data disk (an "
                                           "export of the data disk is kept first")):
        result = CliRunner().invoke(app, [command, "0001", "--inventory", str(path)], env={
            "STORE_ROLLOUT_SETTINGS_FILE": "", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/dev/null",
            "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "127.0.0.1",
            "STORE_ROLLOUT_COBBLER_URL": "https://c.invalid/", "STORE_ROLLOUT_COBBLER_USER": "u",
            "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "p",
            "STORE_ROLLOUT_ERP_URL": "https://e.invalid", "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "t",
            "STORE_ROLLOUT_IMAGE_BASE_URL": "https://i.invalid"})
        text = " ".join(result.output.split())
        assert result.exit_code == 2 and says in text and "add --yes to go on" in text, text
