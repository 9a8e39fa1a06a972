"""A static host's addressing checked as one network: ip, netmask and gateway, as the install
profile and the bridge will use them (ValueError naming the field and the fix)."""

from __future__ import annotations

import ipaddress


def check_addressing(ip: str, netmask: str | None, gateway: str | None) -> None:
    """ip, netmask and gateway as one network, as AutoYaST and the bridge will use them."""
    if ip == "dhcp":
        extra = [f"{n} {v}" for n, v in (("netmask", netmask), ("gateway", gateway))
                 if v]
        if extra:
            raise ValueError(f"{' and '.join(extra)} given for a DHCP host (ip: dhcp): remove "
                             f"{'it' if len(extra) == 1 else 'them'}, or give the host its "
                             "static ip")
        return
    if netmask is None:
        raise ValueError(f"ip {ip} without a netmask: add netmask (e.g. 255.255.255.0) "
                         "or use ip: dhcp")
    try:
        net = ipaddress.IPv4Network(f"{ip}/{netmask}", strict=False)
    except ValueError:
        raise ValueError(f"netmask {netmask} is not a network mask (its one-bits must be "
                         "contiguous, like 255.255.255.0)") from None
    where = f"(ip {ip}, netmask {netmask}: network {net})"
    if net.prefixlen < 31 and ipaddress.IPv4Address(ip) in (net.network_address,
                                                                 net.broadcast_address):
        kind = "network" if ipaddress.IPv4Address(ip) == net.network_address else "broadcast"
        raise ValueError(f"ip {ip} is the {kind} address of {net}: use a host address "
                         "of that network or fix the netmask")
    if gateway is not None:
        router = ipaddress.IPv4Address(gateway)
        if router not in net:
            raise ValueError(f"gateway {gateway} is outside the host's network {where}: "
                             "use a gateway in that network or fix ip/netmask")
        if str(router) == ip:
            raise ValueError(f"gateway {gateway} is the host's own ip: use the store "
                             "router's address")
        if net.prefixlen < 31 and router in (net.network_address, net.broadcast_address):
            raise ValueError(f"gateway {gateway} is not a host address {where}: use the "
                             "store router's address")
