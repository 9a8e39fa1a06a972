"""The lab tests' helpers that need no lab: wait_for, and reading a rollout's report artifact."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from store_rollout.steps import STEPS, markdown_report
from tests.helpers import Background, parse_rollout_report, wait_for


def test_wait_for_returns_the_first_truthy_value() -> None:
    values: Iterator[object] = iter([None, 0, [], {"state": "running"}, "later"])
    assert wait_for(lambda: next(values), timeout=2, interval=0.01, what="vm") == {"state": "running"}


class Falsy(dict[str, object]):
    """A value that prints like data but is falsy."""

    def __bool__(self) -> bool:
        return False


def test_wait_for_names_what_and_the_last_value_on_timeout() -> None:
    counter = itertools.count()
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"^hypervisor ready: not within 0.3s \(\d+ tries\); "
                                             r"last value: \{'n': \d+, 'ready': False\}$"):
        wait_for(lambda: Falsy(n=next(counter), ready=False), timeout=0.3, interval=0.05,
                 what="hypervisor ready")
    assert 0.3 <= time.monotonic() - started < 1.0


def test_wait_for_lets_an_error_through_at_once() -> None:
    def broken() -> None:
        raise ConnectionError("api down")

    started = time.monotonic()
    with pytest.raises(ConnectionError, match="api down"):
        wait_for(broken, timeout=5, what="api")
    assert time.monotonic() - started < 1


def test_parse_rollout_report_reads_what_markdown_report_writes() -> None:
    seconds = {step: n + 0.125 for n, step in enumerate(STEPS)}
    del seconds["notify_erp"]  # a step the run did not time is absent, not invented
    key = "0123456789abcdef" + "f" * 48
    markdown = markdown_report("0042", {
        "step_seconds": seconds, "image_key": key, "erp_id": "ERP-1",
        "vm": {"domain": "store-0042-vm", "uuid": "6f1c-uuid", "disk": "/d", "backing": "/b"}})
    assert parse_rollout_report(markdown) == {
        "step_seconds": seconds, "image_key_prefix": key[:16], "vm_uuid": "6f1c-uuid"}


def test_background_error_is_raised_at_join_in_the_test_that_started_it() -> None:
    background = Background()
    done: list[str] = []

    def restart() -> None:
        raise RuntimeError("lab: cobblerd exited after start")

    background.later(0.01, restart)
    background.later(0.02, lambda: done.append("other action"))
    with pytest.raises(RuntimeError, match="cobblerd exited after start"):
        background.join()
    assert done == ["other action"]  # every action was waited for, not only the failed one
    background.join()  # raised once: a second join has nothing to report


def test_background_step_action_runs_in_the_step_and_its_error_waits_for_join() -> None:
    from store_rollout import steps

    background = Background()
    seen: list[str] = []

    def action() -> None:
        seen.append("acted")
        raise ValueError("ERP fault refused")

    with background.on_step("notify_erp", action):
        steps._notify("s1", "create_vm", "running", 0.0)
        steps._notify("s1", "notify_erp", "running", 0.0)  # the step goes on: no raise here
        steps._notify("s1", "notify_erp", "running", 0.0)  # once only
    assert seen == ["acted"]
    with pytest.raises(ValueError, match="ERP fault refused"):
        background.join()
