"""Preflight reads root's password out of each platform's rendered profile (AutoYaST XML,
Agama JSON): a shared one is refused for both (tasks/preflight.py)."""

from __future__ import annotations

import json

import pytest

from tasks.preflight import _root_passwords


def test_root_passwords_of_an_agama_profile_and_an_autoyast_one() -> None:
    agama = {"product": {"id": "SLES"}, "root": {"hashedPassword": True, "password": "!"}}
    assert _root_passwords(json.dumps(agama, indent=2)) == ["!"]
    assert _root_passwords(json.dumps({**agama, "root": {"password": "$6$x$shared"}})) == [
        "$6$x$shared"]
    assert _root_passwords(json.dumps({"product": {"id": "SLES"}})) == []
    xml = ('<profile xmlns="http://www.suse.com/1.0/yast2ns"><users><user><username>root'
           '</username><user_password>!</user_password></user></users></profile>')
    assert _root_passwords(xml) == ["!"]


def test_a_render_that_is_neither_is_named() -> None:
    with pytest.raises(ValueError, match="renders no XML or JSON"):
        _root_passwords("install: yes")
