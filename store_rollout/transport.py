"""The rule for the outside systems' URLs (Cobbler, the ERP, Redfish BMCs): `https://`, except
on this machine's loopback, unless an explicit `insecure_<system>_http` setting lets plain
HTTP through (a lab's; logged as a warning by each client it builds, tasks/transport.py)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

# the systems the rule covers: the setting STORE_ROLLOUT_INSECURE_<SYSTEM>_HTTP
SYSTEMS = ("cobbler", "erp", "redfish")


def insecure_setting(system: str) -> str:
    """The variable that lets plain HTTP through to `system`, e.g. STORE_ROLLOUT_INSECURE_ERP_HTTP."""
    return f"STORE_ROLLOUT_INSECURE_{system.upper()}_HTTP"


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 and localhost: the request never leaves this machine."""
    if not host:
        return False
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plain_http(url: str) -> bool:
    """Whether requests to `url` would cross a network in clear (http:// off the loopback)."""
    parts = urlsplit(url)
    return parts.scheme.lower() == "http" and not is_loopback(parts.hostname)


def url_problem(url: str, system: str, field: str, insecure: bool) -> str | None:
    """Why `url` (of the setting or Block field `field`) may not be used for `system`, in one
    line naming the fix; None when it may."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        return f"{field}: {url!r} is not an https:// URL: use https://host/..."
    if plain_http(url) and not insecure:
        return (f"{field}: {url!r} would send {system}'s credentials in clear: use https://, or "
                f"set {insecure_setting(system)}=true (a test setup only; logged each time)")
    return None


def checked_url(url: str, system: str, field: str, insecure: bool) -> str:
    """`url` when the rule lets it through, else ValueError with `url_problem`'s line."""
    problem = url_problem(url, system, field, insecure)
    if problem:
        raise ValueError(problem)
    return url
