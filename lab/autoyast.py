"""Read a rendered AutoYaST profile the way the installer would use it, for the lab simulator.

Only what the lab acts on: the files the profile writes (<files><file>) and the Cobbler nopxe URL
its scripts call at the end of the install (pxe_just_once).  Stdlib only.  An Agama profile is
read by lab/agama.py into the same `RenderedInstall`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Literal

NOPXE_RE = re.compile(r"""https?://[^\s"'<>]+/cblr/svc/op/nopxe/system/[^\s"'<>;&|)]+""")
SCRIPT_SECTIONS = ("pre-scripts", "postpartitioning-scripts", "chroot-scripts", "post-scripts",
                   "init-scripts")


@dataclass(frozen=True)
class RenderedInstall:
    files: dict[str, str] = field(default_factory=dict)  # path -> content
    nopxe_url: str | None = None
    # which installer's profile it was: the platform of a profile that names none
    installer: Literal["autoyast", "agama"] = "autoyast"


def _local(tag: str) -> str:
    # Profiles normally carry the yast2ns default namespace, but hand-written ones may not.
    return tag.rsplit("}", 1)[-1]


def _child(elem: ET.Element, name: str) -> ET.Element | None:
    return next((c for c in elem if _local(c.tag) == name), None)


def _children(elem: ET.Element | None, name: str) -> list[ET.Element]:
    return [] if elem is None else [c for c in elem if _local(c.tag) == name]


def _text(elem: ET.Element | None, name: str) -> str | None:
    child = None if elem is None else _child(elem, name)
    return None if child is None else (child.text or "")


def parse_autoyast(xml_text: str) -> RenderedInstall:
    """Files and nopxe URL of a rendered profile; raises ValueError if it is not AutoYaST."""
    try:
        root = ET.fromstring(xml_text.lstrip())  # an XML declaration must come first
    except ET.ParseError as exc:
        raise ValueError(f"not well-formed XML: {exc}") from exc
    if _local(root.tag) != "profile":
        raise ValueError(f"not an AutoYaST profile: root element is {root.tag!r}")

    files: dict[str, str] = {}
    for file in _children(_child(root, "files"), "file"):
        path = _text(file, "file_path")
        if path:
            files[path.strip()] = _text(file, "file_contents") or ""

    return RenderedInstall(files=files, nopxe_url=_nopxe_url(_child(root, "scripts")))


def _nopxe_url(scripts: ET.Element | None) -> str | None:
    if scripts is None:
        return None
    for section in SCRIPT_SECTIONS:  # installer order: the first call executed wins
        for script in _children(_child(scripts, section), "script"):
            match = NOPXE_RE.search(_text(script, "source") or "")
            if match:
                return match.group(0)
    return None
