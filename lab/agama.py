"""Read a rendered Agama profile (its native JSON) the way the installer would use it, for the lab
simulator: the same result as lab/autoyast.py's for an AutoYaST profile.

Only what the lab acts on: the files the profile writes (`files`: destination, content) and the
Cobbler nopxe URL its scripts call at the end of the install. `parse_profile` takes either kind,
as Cobbler serves it (a JSON object or an XML document). Stdlib only.
"""

from __future__ import annotations

import json
from typing import Any

from lab.autoyast import NOPXE_RE, RenderedInstall, parse_autoyast

# Agama's script groups, in the order the installer runs them
SCRIPT_GROUPS = ("pre", "postPartitioning", "post", "init")


def parse_agama(json_text: str) -> RenderedInstall:
    """Files and nopxe URL of a rendered Agama profile; ValueError naming what is wrong if it
    is not one (not JSON, no `product`, a file without destination or inline content)."""
    try:
        profile = json.loads(json_text)
    except ValueError as exc:
        raise ValueError(f"not an Agama profile: not valid JSON ({exc})") from None
    if not isinstance(profile, dict) or not isinstance(profile.get("product"), dict):
        raise ValueError("not an Agama profile: no `product` object at the top level")
    files: dict[str, str] = {}
    for n, entry in enumerate(profile.get("files") or []):
        destination = entry.get("destination") if isinstance(entry, dict) else None
        if not destination:
            raise ValueError(f"Agama profile: files[{n}] has no destination")
        if "content" not in entry:
            raise ValueError(f"Agama profile: files[{n}] ({destination}) has no inline content "
                             "(a `url` source is not read by the lab's installer)")
        files[str(destination)] = str(entry["content"])
    return RenderedInstall(files=files, nopxe_url=_nopxe_url(profile.get("scripts") or {}),
                           installer="agama")


def _nopxe_url(scripts: dict[str, Any]) -> str | None:
    for group in SCRIPT_GROUPS:  # installer order: the first call executed wins
        for script in scripts.get(group) or []:
            match = NOPXE_RE.search(str(script.get("content") or script.get("body") or ""))
            if match:
                return match.group(0)
    return None


def parse_profile(text: str) -> RenderedInstall:
    """What Cobbler served, read by its kind: an Agama profile (a JSON object) or an AutoYaST
    one (XML)."""
    if text.lstrip().startswith("{"):
        return parse_agama(text)
    return parse_autoyast(text)
