"""Issue 44, item 1: the master's reactor renders what an event says as data, never as code.

A minion chooses the tag and, in a batch event, the whole data (`id` included), and reactor.yaml's
`store/vm/firstboot/*` is an fnmatch glob whose `*` matches a newline. Each case is rendered by
Salt's own Reactor (salt.utils.reactor: list_reactors matches the tag against the project's
reactor.yaml, reactions renders the sls with the master's jinja|yaml renderer and compiles the
chunks it would run), with no daemon.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.salt_master import daemon_paths, reactor_config
from store_rollout.contracts import (
    FIRSTBOOT_EVENT_PREFIX,
    FIRSTBOOT_EVENTS,
    ROLLOUT_PROGRESS_TAG,
)

# a second reaction, as a compromised minion writes it into its tag: root on every minion
INJECTED_REACTION = ("\nowned:\n  local.cmd.run:\n    - tgt: '*'\n    - args:\n"
                     "      - cmd: touch /tmp/owned")
INJECTED_TAG = FIRSTBOOT_EVENT_PREFIX + "done" + INJECTED_REACTION
# the same through the id, closed so that the sls's next line still parses
INJECTED_ID = ('store-0002-vm"\'\nowned:\n  wheel.key.delete:\n    - args:\n'
               "      - match: store-0001-hv\npad:\n  runner.event.send:\n    - args:\n"
               "      - data:\n          minion: x")


@pytest.fixture(scope="module")
def reactor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import salt.config
    import salt.utils.reactor

    root = tmp_path_factory.mktemp("reactor-master")
    conf = root / "master"
    conf.write_text(yaml.safe_dump({
        **daemon_paths(root, "master"), "extension_modules": str(root / "extmods"),
        "file_roots": {"base": [str(root / "states")]},
        "pillar_roots": {"base": [str(root / "pillar")]}, "reactor": reactor_config()}))
    reactor = salt.utils.reactor.Reactor(salt.config.master_config(str(conf)))
    yield reactor
    reactor.minion.destroy()


def chunks(reactor: Any, tag: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """What the master's reactor would run for this event."""
    files = reactor.list_reactors(tag)
    assert files, f"no reactor matches {tag!r}: the case tests nothing"
    return list(reactor.reactions(tag, data, files))


@pytest.mark.parametrize("event", FIRSTBOOT_EVENTS)
def test_a_firstboot_event_is_reannounced_once(reactor: Any, event: str) -> None:
    tag = FIRSTBOOT_EVENT_PREFIX + event
    found = chunks(reactor, tag, {"id": "store-0001-vm", "data": {}})
    assert [(c["state"], c["fun"], c["args"]) for c in found] == [
        ("runner", "event.send", [{"tag": ROLLOUT_PROGRESS_TAG},
                                  {"data": {"minion": "store-0001-vm", "tag": tag}}])], found


def test_a_tag_carrying_a_second_reaction_renders_nothing(reactor: Any) -> None:
    found = chunks(reactor, INJECTED_TAG, {"id": "store-0002-vm", "data": {}})
    assert found == [], found


def test_an_id_carrying_a_second_reaction_stays_one_string(reactor: Any) -> None:
    tag = FIRSTBOOT_EVENT_PREFIX + "done"
    found = chunks(reactor, tag, {"id": INJECTED_ID, "data": {}})
    assert [(c["state"], c["fun"]) for c in found] == [("runner", "event.send")], found
    assert found[0]["args"][1] == {"data": {"minion": INJECTED_ID, "tag": tag}}


@pytest.mark.parametrize("tag", [FIRSTBOOT_EVENT_PREFIX + "other",
                                 FIRSTBOOT_EVENT_PREFIX + "done/more",
                                 FIRSTBOOT_EVENT_PREFIX + "done "])
def test_an_unknown_firstboot_tag_renders_nothing(reactor: Any, tag: str) -> None:
    assert chunks(reactor, tag, {"id": "store-0001-vm", "data": {}}) == []


def test_odd_data_is_still_data(reactor: Any) -> None:
    """Characters YAML reads as line breaks or refuses raw, and data that is no string."""
    tag = FIRSTBOOT_EVENT_PREFIX + "started"
    odd = "a\u2028b\x85c\U0001F600d\x7fe\t: f"
    found = chunks(reactor, tag, {"id": odd})
    assert [c["args"][1]["data"]["minion"] for c in found] == [odd], found
    found = chunks(reactor, tag, {"id": {"nested": ["x"]}})
    assert [c["args"][1]["data"]["minion"] for c in found] == ["{'nested': ['x']}"], found


def test_the_reactor_sls_is_the_one_salt_serves() -> None:
    """The fixture renders the file reactor.yaml names, not a copy."""
    files = [f for entry in reactor_config() for fs in entry.values() for f in fs]
    assert [Path(f).name for f in files] == ["firstboot_progress.sls"], files
