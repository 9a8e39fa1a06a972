"""Issue 30, notifications (tasks/notifications.py): what the automations are, and the step a
failed run reports. Delivery through a real Prefect server and the lab's chat channel:
tests/lab/test_faults.py (a failed rollout, one message), tests/lab/test_windows_lab.py (a rollout
waiting for its window, one message)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest

from store_rollout.steps import StepClock, take_failed_step
from tasks.notifications import (
    HYPERVISOR_INSTALL_STARTED_EVENT,
    HYPERVISOR_READY_EVENT,
    HYPERVISOR_WAIT_ENDED_EVENT,
    ROLLOUT_FAILED_EVENT,
    automations,
    ensure_notifications,
)
from tasks.windows import AWAITING_WINDOW


def test_one_automation_per_kind_each_acting_once_per_event() -> None:
    block = uuid4()
    found = {a.name: a for a in automations(block, ready_within=600)}
    assert set(found) == {"store-rollout notify: rollout failed",
                          "store-rollout notify: rollout crashed",
                          "store-rollout notify: rollout waits for its window",
                          "store-rollout notify: rollout waits for an approval",
                          "store-rollout notify: hypervisor sent no ready event"}
    expects = {name: a.trigger.expect for name, a in found.items()}  # type: ignore[union-attr]
    assert expects == {"store-rollout notify: rollout failed": {ROLLOUT_FAILED_EVENT},
                       "store-rollout notify: rollout crashed": {"prefect.flow-run.Crashed"},
                       "store-rollout notify: rollout waits for its window":
                           {f"prefect.flow-run.{AWAITING_WINDOW}"},
                       "store-rollout notify: rollout waits for an approval":
                           {"prefect.flow-run.Paused"},
                       "store-rollout notify: hypervisor sent no ready event":
                           {HYPERVISOR_READY_EVENT, HYPERVISOR_WAIT_ENDED_EVENT}}
    for automation in found.values():
        assert automation.trigger.threshold == 1  # type: ignore[union-attr]
        assert [a.block_document_id for a in automation.actions] == [block]  # type: ignore[union-attr]
    # crashes and waits of store-rollout runs only, not of any flow's
    crashed = found["store-rollout notify: rollout crashed"].trigger
    assert crashed.match_related.root == {  # type: ignore[union-attr]
        "prefect.resource.role": "flow", "prefect.resource.name": "store-rollout"}
    # the silent host: absent a ready event within 600 s of the power-on, per store, once
    silent: Any = found["store-rollout notify: hypervisor sent no ready event"].trigger
    assert silent.after == {HYPERVISOR_INSTALL_STARTED_EVENT} and silent.posture == "Proactive"
    assert silent.within == timedelta(seconds=600) and silent.for_each == {"prefect.resource.id"}
    body = found["store-rollout notify: rollout failed"].actions[0].body  # type: ignore[union-attr]
    for field in ("store_id", "action", "step", "reason", "run_url"):
        assert f"event.payload.{field}" in body
    # a routine window wait says so, it is no miss
    waiting = found["store-rollout notify: rollout waits for its window"].actions[0]
    assert "waiting for its maintenance window" in waiting.subject  # type: ignore[union-attr]
    assert "miss" not in waiting.body  # type: ignore[union-attr]


def test_no_install_started_event_when_step_3_fails_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 3's timeout shorter than the expected install time: step 3's failure is the one
    message, the no-ready-event automation is not armed."""
    from tasks import notifications

    sent: list[str] = []
    monkeypatch.setattr(notifications, "emit_event", lambda event, **_: sent.append(event))
    notifications.announce_install_started("0042", "store-0042-hv", expected_seconds=900,
                                           step_timeout=600)
    assert sent == []
    notifications.announce_install_started("0042", "store-0042-hv", expected_seconds=900,
                                           step_timeout=1800)
    assert sent == [HYPERVISOR_INSTALL_STARTED_EVENT]


def test_a_failed_rollback_or_decommission_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from tasks import notifications

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(notifications, "emit_event",
                        lambda event, **kw: sent.append((event, kw.get("payload") or {})))
    run = SimpleNamespace(parameters={"store_id": "0042"}, id=uuid4(), name="rollback-0042")
    notifications.notify_failure(SimpleNamespace(name="store-rollback"), run,
                                 SimpleNamespace(message="VM busy", name="Failed"))
    failed = [payload for event, payload in sent if event == ROLLOUT_FAILED_EVENT]
    assert [(p["action"], p["step"]) for p in failed] == [("rollback", "rollback")]
    # and the no-ready-event automation expects nothing more of this store's install
    assert HYPERVISOR_WAIT_ENDED_EVENT in [event for event, _ in sent]


def test_a_failed_step_is_reported_once_and_a_new_run_starts_clean() -> None:
    def broken() -> None:
        raise RuntimeError("down")

    clock = StepClock("s-notify")
    with pytest.raises(RuntimeError):
        clock.run("create_vm", broken)
    assert take_failed_step("s-notify") == "create_vm"
    assert take_failed_step("s-notify") is None  # once
    with pytest.raises(RuntimeError):
        StepClock("s-notify").run("image", broken)
    StepClock("s-notify")  # the next run of that store: the old failure is not its
    assert take_failed_step("s-notify") is None


def test_a_block_named_without_its_type_is_refused_saying_how() -> None:
    with pytest.raises(ValueError, match="<block type>/<block name> .*slack-webhook/ops"):
        ensure_notifications("ops-chat", 600)
