"""Notifications: Prefect automations the project declares and `prefect-setup` creates, each
sending one message through the Prefect notification block the settings name
(`notification_block`: a webhook, mail or chat block) when something needs a person:

- a rollout, rollback or decommission failed: the flow's failure hook emits
  `ROLLOUT_FAILED_EVENT` once, naming the store, what failed, the step it failed in, the reason
  and the run's page;
- a rollout crashed (its process or machine died: the dead-run automation marks it Crashed);
- a rollout waits for its store's maintenance window (state AwaitingWindow): routine, said so;
- a rollout waits for an approval (paused with its plan on its page, tasks/approvals.py);
- a hypervisor sent no ready event within its expected install time (a proactive trigger:
  step 2 emits `HYPERVISOR_INSTALL_STARTED_EVENT` when it powers the host on into its install,
  step 3 `HYPERVISOR_READY_EVENT` when the host is ready, and `HYPERVISOR_WAIT_ENDED_EVENT`
  when its wait ended otherwise (another box's serial, a failure, a cancel), which the failure
  message covers; the setting `hypervisor_ready_expected_seconds` is shorter than step 3's own
  timeout, so a person hears of a silent host while step 3 still waits, and when step 3's
  timeout is the shorter, step 3's failure is the one message).

One automation per kind, each acting once per event: one event, one message.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final
from uuid import UUID

from prefect.events import emit_event
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from store_rollout.steps import take_failed_step
from tasks.run_health import ensure_automation
from tasks.windows import AWAITING_WINDOW

ROLLOUT_FAILED_EVENT: Final = "store-rollout.rollout.failed"
HYPERVISOR_INSTALL_STARTED_EVENT: Final = "store-rollout.hypervisor.install-started"
HYPERVISOR_READY_EVENT: Final = "store-rollout.hypervisor.ready"
HYPERVISOR_WAIT_ENDED_EVENT: Final = "store-rollout.hypervisor.wait-ended"
FLOW_NAME: Final = "store-rollout"
PREFIX: Final = "store-rollout notify: "
RUN_NAME = "{{ event.resource['prefect.resource.name'] }}"
STATE_MESSAGE = "{{ event.payload.validated_state.message }}"


def run_url(flow_run_id: UUID | None) -> str:
    """The run's page in the Prefect UI (as the client's settings know the UI)."""
    from prefect.settings import get_current_settings

    ui = get_current_settings().ui_url
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui and flow_run_id else "(not a flow run)"


def notify_failure(flow: Any, flow_run: Any, state: Any) -> None:
    """The failure hook of the rollout, rollback and decommission flows: one
    ROLLOUT_FAILED_EVENT naming the store, what failed, the step it failed in, the reason and
    the run's page (the automation turns it into one message)."""
    store_id = str(flow_run.parameters.get("store_id", "?"))
    action = str(getattr(flow, "name", FLOW_NAME)).removeprefix("store-")
    end_hypervisor_wait(store_id)
    emit_event(event=ROLLOUT_FAILED_EVENT, resource=_store_resource(store_id),
               related=[{"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                         "prefect.resource.role": "flow-run",
                         "prefect.resource.name": flow_run.name}],
               payload={"store_id": store_id, "action": action,
                        "step": take_failed_step(store_id) or (
                            "validation (before step 1)" if action == "rollout" else action),
                        "reason": str(state.message or state.name)[:2000],
                        "run_url": run_url(flow_run.id)})


def _store_resource(store_id: str) -> dict[str, str]:
    return {"prefect.resource.id": f"store.{store_id}", "prefect.resource.name": f"store {store_id}",
            "store.id": store_id}


def _this_run() -> tuple[list[dict[str, str]], str]:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context else None
    if run is None:
        return [], run_url(None)
    return ([{"prefect.resource.id": f"prefect.flow-run.{run.id}",
              "prefect.resource.role": "flow-run", "prefect.resource.name": run.name}],
            run_url(run.id))


def announce_install_started(store_id: str, hypervisor: str, expected_seconds: float,
                               step_timeout: float) -> None:
    """Step 2 powered the host on into its install: its ready event is due within
    `expected_seconds` (the no-ready-event automation waits for it)."""
    if step_timeout <= expected_seconds:  # step 3 fails first: its failure is the message
        return
    related, url = _this_run()
    emit_event(event=HYPERVISOR_INSTALL_STARTED_EVENT, resource=_store_resource(store_id),
               related=related,
               payload={"store_id": store_id, "hypervisor": hypervisor,
                        "expected_seconds": expected_seconds, "step_timeout": step_timeout,
                        "run_url": url})


def end_hypervisor_wait(store_id: str) -> None:
    """Step 3's wait ended without a ready host (a failure, another box, a cancel): the
    no-ready-event automation expects nothing more of this install."""
    related, _ = _this_run()
    emit_event(event=HYPERVISOR_WAIT_ENDED_EVENT, resource=_store_resource(store_id),
               related=related, payload={"store_id": store_id})


def announce_hypervisor_ready(store_id: str, hypervisor: str) -> None:
    related, _ = _this_run()
    emit_event(event=HYPERVISOR_READY_EVENT, resource=_store_resource(store_id), related=related,
               payload={"store_id": store_id, "hypervisor": hypervisor})


def _flow_runs_of(event: str) -> EventTrigger:
    return EventTrigger(expect={event},
                        match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
                        match_related=ResourceSpecification({"prefect.resource.role": "flow",
                                                             "prefect.resource.name": FLOW_NAME}),
                        posture=Posture.Reactive, threshold=1)


def automations(block_id: UUID, ready_within: float) -> list[AutomationCore]:
    """`ready_within`: seconds a hypervisor has from its power-on into the install to its
    ready event before the operators hear of it."""
    def send(subject: str, body: str) -> list[Any]:
        return [SendNotification(block_document_id=block_id, subject=subject, body=body)]

    failed = AutomationCore(
        name=PREFIX + "rollout failed",
        description="One message per failed rollout, rollback or decommission: store, step, "
                    "reason, run page.",
        trigger=EventTrigger(expect={ROLLOUT_FAILED_EVENT},
                             match=ResourceSpecification({"prefect.resource.id": "store.*"}),
                             posture=Posture.Reactive, threshold=1),
        actions=send("store {{ event.payload.store_id }}: {{ event.payload.action }} failed "
                     "in step {{ event.payload.step }}",
                     "Store {{ event.payload.store_id }}: the {{ event.payload.action }} "
                     "failed in step "
                     "{{ event.payload.step }}.\nReason: {{ event.payload.reason }}\n"
                     "Run: {{ event.payload.run_url }}"))
    crashed = AutomationCore(
        name=PREFIX + "rollout crashed",
        description="One message per crashed rollout (its process or machine died).",
        trigger=_flow_runs_of("prefect.flow-run.Crashed"),
        actions=send(f"{RUN_NAME}: crashed",
                     f"Rollout run {RUN_NAME} crashed: its process or machine died; the step it "
                     f"was in is on its page. Reason: {STATE_MESSAGE}\n"
                     "Run: {{ flow_run|ui_url }}\nRun the store again: it resumes."))
    waiting = AutomationCore(
        name=PREFIX + "rollout waits for its window",
        description="A rollout waits for its store's maintenance window (routine: it goes "
                    "on by itself when the window opens).",
        trigger=_flow_runs_of(f"prefect.flow-run.{AWAITING_WINDOW}"),
        actions=send(f"{RUN_NAME}: waiting for its maintenance window",
                     f"Rollout run {RUN_NAME} is waiting for its window: {STATE_MESSAGE}\nRun: "
                     "{{ flow_run|ui_url }}\n(`store-rollout rollout <store> --now` overrides "
                     "the window in an emergency.)"))
    approval = AutomationCore(
        name=PREFIX + "rollout waits for an approval",
        description="A rollout that would destroy something that works (or, under the "
                    "'always' policy, change anything) waits for a person's answer.",
        trigger=_flow_runs_of("prefect.flow-run.Paused"),
        actions=send(f"{RUN_NAME}: waits for your approval",
                     f"Rollout run {RUN_NAME} waits for an approval: its page shows what it "
                     "would do and the form to approve or reject it.\nRun: "
                     "{{ flow_run|ui_url }}"))
    silent = AutomationCore(
        name=PREFIX + "hypervisor sent no ready event",
        description="A store host powered on into its install sent no ready event within its "
                    "expected install time (step 3 still waits, up to its own timeout).",
        trigger=EventTrigger(after={HYPERVISOR_INSTALL_STARTED_EVENT},
                             expect={HYPERVISOR_READY_EVENT, HYPERVISOR_WAIT_ENDED_EVENT},
                             match=ResourceSpecification({"prefect.resource.id": "store.*"}),
                             for_each={"prefect.resource.id"}, posture=Posture.Proactive,
                             threshold=1, within=timedelta(seconds=ready_within)),
        actions=send("store {{ event.payload.store_id }}: no ready event from its hypervisor",
                     "Store {{ event.payload.store_id }}: hypervisor "
                     "{{ event.payload.hypervisor }} sent no ready event within "
                     "{{ event.payload.expected_seconds }} s of its power-on into the install "
                     "(step wait_for_hypervisor waits up to {{ event.payload.step_timeout }} s). "
                     "Look at its console (BMC) and at the Salt master's log.\n"
                     "Run: {{ event.payload.run_url }}"))
    return [failed, crashed, waiting, approval, silent]


def ensure_notifications(block_name: str, ready_within: float) -> dict[str, str]:
    """Create the automations, or bring existing ones of those names up to date, sending
    through the notification block `block_name` (`<block type>/<name>`); says what it did
    with each."""
    from prefect.blocks.core import Block

    if "/" not in block_name:
        raise ValueError(f"notification_block {block_name!r}: name the block as Prefect does, "
                         "<block type>/<block name> (e.g. slack-webhook/ops, "
                         "custom-webhook/ops-notify; `prefect block ls` lists them)")
    block: Any = Block.load(block_name)  # sync here: no running event loop
    block_id = block._block_document_id
    if block_id is None:
        raise RuntimeError(f"notification block {block_name!r} has no document id")
    return {wanted.name: ensure_automation(wanted)
            for wanted in automations(block_id, ready_within)}
