"""The inventory's host addressing is checked as one network (no lab needed)."""

from __future__ import annotations

from typing import Any

import pytest

from store_rollout.inventory import InventoryError, parse_inventory


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
