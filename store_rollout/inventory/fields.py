"""Checks of single inventory fields the model (`models`) applies: a value spelled by a pattern,
a PXE NIC's MAC, a refreshed box's hypervisor minion id, and `defaults.platform` filled in.
Each error names the field and how to write it."""

from __future__ import annotations

import re
from typing import Any

from pydantic import AfterValidator

from store_rollout.contracts import REFRESHED_HV_ID_RE

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
MAC_RE = re.compile(r"^([0-9a-f]{2}[:-]){5}[0-9a-f]{2}$")


def spelled(pattern: str, what: str, how: str) -> AfterValidator:
    """A field whose value must match `pattern`; the error names it and how to write it."""
    regex = re.compile(pattern)

    def check(value: str | None) -> str | None:
        if value is not None and not regex.fullmatch(value):
            raise ValueError(f"invalid {what} {value!r}: {how}")
        return value

    return AfterValidator(check)


def checked_mac(given: str) -> str:
    """A PXE NIC's MAC, lowercase with ':'; ValueError naming what is wrong with it."""
    norm = given.strip().lower()
    if not MAC_RE.fullmatch(norm):
        raise ValueError(f"invalid MAC {given!r}: use six hex pairs like 52:54:00:12:34:56")
    norm = norm.replace("-", ":")
    # Cobbler and DHCP key the host on this MAC: an address no NIC sends from would leave
    # the PXE boot unanswered (or answer every machine)
    if norm == "00:00:00:00:00:00":
        raise ValueError(f"MAC {given!r} is all zeros (an empty ERP field or a placeholder): "
                         "use the MAC printed on the hypervisor's PXE NIC")
    if norm == "ff:ff:ff:ff:ff:ff":
        raise ValueError(f"MAC {given!r} is the broadcast address, not a NIC's: use the MAC "
                         "printed on the hypervisor's PXE NIC")
    if int(norm[:2], 16) & 1:
        raise ValueError(f"MAC {given!r} is a multicast address (the low bit of its first octet "
                         "is set; no NIC has one): use the NIC's unicast MAC")
    return norm


def mac_suffix(mac: str) -> str:
    """The last 6 hex digits of a MAC: what a refreshed box's hypervisor minion id ends in."""
    return mac.replace(":", "").replace("-", "").lower()[-6:]


def refreshed_minion_id(store_id: str, mac: str) -> str:
    """The hypervisor minion id of a store's box after a hardware refresh (contracts
    REFRESHED_HV_ID_RE): store-<id>-hv-<last 6 hex digits of its MAC>."""
    return f"store-{store_id}-hv-{mac_suffix(mac)}"


def minion_id_problem(minion_id: str, store_id: str, mac: str) -> str | None:
    """Why `minion_id` cannot be the hypervisor minion id of store `store_id`'s box with PXE
    MAC `mac` (None: it can): it must be store-<id>-hv, or store-<id>-hv-<last 6 hex digits
    of the MAC> (a refreshed box)."""
    base = f"store-{store_id}-hv"
    expected = f"{base} or {refreshed_minion_id(store_id, mac)}"
    if not re.fullmatch(REFRESHED_HV_ID_RE, minion_id) or not (
            minion_id == base or minion_id.startswith(base + "-")):
        return (f"minion_id {minion_id!r} is not store {store_id}'s: write {expected} "
                "(as the refresh's result says), or leave it empty for store-<id>-hv")
    if minion_id != base and minion_id != refreshed_minion_id(store_id, mac):
        return (f"minion_id {minion_id!r} does not end in the last 6 hex digits of "
                f"hypervisor.mac {mac}: write {expected}, or fix hypervisor.mac")
    return None


def with_default_platform(raw: Any) -> Any:
    """The raw inventory with `defaults.platform` as each store's hypervisor.platform where the
    store names none (anything malformed is left for its own field's error)."""
    defaults = raw.get("defaults") if isinstance(raw, dict) else None
    given = defaults.get("platform") if isinstance(defaults, dict) else None
    if not given or not isinstance(raw.get("stores"), list):
        return raw
    return {**raw, "stores": [
        {**s, "hypervisor": {"platform": given, **s["hypervisor"]}}
        if isinstance(s, dict) and isinstance(s.get("hypervisor"), dict) else s
        for s in raw["stores"]]}
