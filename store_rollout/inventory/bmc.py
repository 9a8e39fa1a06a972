"""Which BMC a store's host answers on, as the inventory names it."""

from __future__ import annotations


def bmc_identity(address: str | None, power_type: str | None, port: int | None,
                 redfish_system_id: str | None) -> tuple[str, str, str] | None:
    """What one BMC answers on: its address (scheme, case and a trailing "/" aside), port (the
    protocol's default when none is given) and Redfish system; None: no address given. Two
    hosts with one identity would have step 2 of one store power-cycle the other."""
    if not address:
        return None
    where = address.lower().split("://", 1)[-1].rstrip("/")
    default = {"ipmi": "623", "redfish": "443"}.get(power_type or "", "default")
    return where, str(port or default), redfish_system_id or ""
