"""A flow run whose process died is marked Crashed, not left Running: heartbeats plus the
Prefect automation Prefect documents for "zombie" flow runs (docs/reliability.md).

Each flow run sends a `prefect.flow-run.heartbeat` event every `HEARTBEAT_SECONDS` from a thread
of its own process (`PREFECT_FLOWS_HEARTBEAT_FREQUENCY`: the lab sets it for its worker and the
CLI; production sets it on every worker). A step that waits for 30 minutes keeps beating, so a
long legitimate wait is never taken for a dead run. The automation marks a run Crashed once
`ZOMBIE_AFTER_SECONDS` pass after a heartbeat with neither another heartbeat nor a final state.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import MissingContextError
from prefect.states import Running

from tasks.slots import this_flow_run

HEARTBEAT_SECONDS = 30  # Prefect's minimum
# three heartbeats missed: a loaded worker's late beat is no crash
ZOMBIE_AFTER_SECONDS = 90
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS)}
AUTOMATION_NAME = "store-rollout: crash flow runs that stopped beating"
CRASH_MESSAGE = (f"no heartbeat for {ZOMBIE_AFTER_SECONDS} s: the flow run's process or "
                 "machine died; run the store again, it resumes")


def zombie_automation() -> AutomationCore:
    final = ("Completed", "Failed", "Cancelled", "Crashed")
    return AutomationCore(
        name=AUTOMATION_NAME,
        description="Marks a flow run Crashed when its heartbeats stop (its process died).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in final)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=ZOMBIE_AFTER_SECONDS),
        ),
        actions=[ChangeFlowRunState(name=None, state=StateType.CRASHED, message=CRASH_MESSAGE,
                                    force=False)],
    )


def ensure_zombie_automation() -> str:
    return ensure_automation(zombie_automation())


def ensure_automation(wanted: AutomationCore) -> str:
    """Create the automation, or bring an existing one of that name up to date; says which."""
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(wanted.name)
        if not found:
            client.create_automation(wanted)
            return "created"
        current = found[0]
        if (current.trigger, current.actions, current.enabled) == (
                wanted.trigger, wanted.actions, True):
            return "unchanged"
        client.update_automation(current.id, wanted)
        return "updated"


def run_logger(name: str) -> Any:
    """The current run's logger; the module logger `name` outside a run (a test, a script)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(name)


def say_running(name: str, message: str = "") -> None:
    """This flow run's state becomes Running named `name` with `message` (what its page and
    the API show while it waits, or again once it goes on); nothing outside a run."""
    run = this_flow_run()
    if run is None:
        return
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run, Running(name=name, message=message[:2000]), force=True)


def run_started_at() -> datetime:
    """When this flow run first started (the server's record: a retried or resumed run keeps
    it); now, outside a flow run."""
    run_id = this_flow_run()
    if run_id is None:
        return datetime.now(UTC)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    return run.start_time or run.created or datetime.now(UTC)
