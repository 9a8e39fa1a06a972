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
# Leap 16.0 host keeps Leap's repo-oss, where Leap 16 publishes its updates (no separate update
# repository; a stock install enables it: openSUSE-repos' opensuse-leap16-repoindex.xml)
LEAP16_UPDATE_REPOS = ("https://download.opensuse.org/distribution/leap/16.0/repo/oss/",)
DEFAULT_UPDATE_REPOS: dict[str, tuple[str, ...]] = {"sles15-xen": (),
                                                    "sle16-kvm": LEAP16_UPDATE_REPOS}
# openSUSE's own aliases of its repositories (a Leap install's `zypper lr`), by the end of the
# URL's path, as download.opensuse.org and its mirrors lay them out (Leap 16: repo/oss; the
# older update/leap/<version>/<part> layout by its last segment)
LEAP_UPDATE_ALIASES = {"repo/oss": "repo-oss", "repo/non-oss": "repo-non-oss",
                       "oss": "repo-update", "non-oss": "repo-update-non-oss",
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
        path = url.rstrip("/").split("/")
        alias = (LEAP_UPDATE_ALIASES.get("/".join(path[-2:]))
                 or LEAP_UPDATE_ALIASES.get(path[-1], f"update-{n}"))
        if any(e.startswith(f"{alias}=") for e in entries):
            alias = f"update-{n}"
        entries.append(f"{alias}={url}")
    return " ".join(entries)
