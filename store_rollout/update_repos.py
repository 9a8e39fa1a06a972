"""The update repositories a store host installs from and keeps (setting
`hypervisor_update_repos`): each platform's default, what a valid list is, and how they travel in its
Cobbler record (`update_repos_meta`)."""

from __future__ import annotations

import json
import re
from typing import Any

# each platform's own update repositories, where the host does not register: a SLES host
# (sles15-xen, sle16-kvm with sle16_product sles) gets its product's and modules' update
# repositories from its registration server (RMT, SUSE Manager or SCC), so none are added; a
# Leap 16.0 host adds Leap's (Leap 16 keeps one update repository; non-oss has nothing a
# hypervisor installs)
LEAP16_UPDATE_REPOS = ("https://download.opensuse.org/update/leap/16.0/oss/",)
DEFAULT_UPDATE_REPOS: dict[str, tuple[str, ...]] = {"sles15-xen": (),
                                                    "sle16-kvm": LEAP16_UPDATE_REPOS}
# openSUSE's own aliases of its update repositories (a Leap install's `zypper lr`), by the last
# path segment of the URL, as download.opensuse.org and its mirrors lay them out
LEAP_UPDATE_ALIASES = {"oss": "repo-update", "non-oss": "repo-update-non-oss",
                       "sle": "repo-sle-update", "backports": "repo-backports-update"}
_REPO_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s<>&\"']+")


def repo_list(value: Any) -> Any:
    """The environment's form, a JSON list or space-separated URLs, as a list."""
    if isinstance(value, str):
        if value.strip().startswith("["):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON list of URLs ({exc})") from None
        return value.split()
    return value


def checked_repo_urls(value: list[str]) -> list[str]:
    """`value` if every entry is a repository URL, once; they travel space-separated in
    Cobbler's autoinstall_meta and land in the profile's XML."""
    bad = [url for url in value if not _REPO_URL.fullmatch(url)]
    if bad:
        raise ValueError(f"{bad} not repository URLs: scheme://host/path, no spaces and none "
                         "of <>&\"' (percent-encode them)")
    if len(set(value)) != len(value):
        raise ValueError(f"{value} lists a repository twice")
    return value


def update_repos_meta(urls: list[str]) -> str:
    """The profile's update repositories as one autoinstall_meta string (Cobbler's meta values
    are strings): space-separated `alias=url`, Leap's alias for Leap's repositories, else
    `update-<n>`."""
    entries: list[str] = []
    for n, url in enumerate(urls, 1):
        alias = LEAP_UPDATE_ALIASES.get(url.rstrip("/").rsplit("/", 1)[-1], f"update-{n}")
        if any(e.startswith(f"{alias}=") for e in entries):
            alias = f"update-{n}"
        entries.append(f"{alias}={url}")
    return " ".join(entries)
