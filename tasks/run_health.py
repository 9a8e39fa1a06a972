"""A flow run whose process died is marked Crashed, not left Running: heartbeats plus an
automation like the one Prefect documents for "zombie" flow runs (docs/reliability.md).

Each flow run sends a `HEARTBEAT_EVENT` every `heartbeat_seconds` (a setting) from a thread of
its own process (`heartbeats`, entered by every flow), so a step that waits for 30 minutes keeps
beating and a long legitimate wait is never taken for a dead run. The automation marks a run
Crashed once `MISSED_BEATS` intervals pass after a heartbeat with neither another heartbeat nor a
final state. The beats are the flows' own, not Prefect's (PREFECT_FLOWS_HEARTBEAT_FREQUENCY):
a worker needs no setting for them, the lab may beat faster than Prefect's 30-s minimum, and
the thread stops the moment its run ends where Prefect's finishes its 1-s sleep first.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events import emit_event
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import MissingContextError
from prefect.states import Running

F = TypeVar("F", bound=Callable[..., Any])
HEARTBEAT_EVENT = "store-rollout.flow-run.heartbeat"
# three heartbeats missed: a loaded worker's late beat is no crash
MISSED_BEATS = 3
AUTOMATION_NAME = "store-rollout: crash flow runs that stopped beating"


def this_flow_run() -> UUID | None:
    """The id of the flow run this code runs in, if any."""
    from prefect.runtime import flow_run

    return UUID(flow_run.id) if flow_run.id else None


def zombie_after(heartbeat_seconds: float) -> float:
    """Seconds without a heartbeat after which a Running flow run is taken for dead."""
    return MISSED_BEATS * heartbeat_seconds


def crash_message(heartbeat_seconds: float) -> str:
    return (f"no heartbeat for {zombie_after(heartbeat_seconds):.0f} s: the flow run's process "
            "or machine died; run the store again, it resumes")


@contextmanager
def heartbeats(every_seconds: float, emit: Callable[..., Any] = emit_event) -> Iterator[None]:
    """This flow run sends `HEARTBEAT_EVENT` now and every `every_seconds` while the block runs,
    from a thread (a step blocked in a call still beats); nothing outside a flow run."""
    from prefect.runtime import flow_run

    run_id = this_flow_run()
    if run_id is None:
        yield
        return
    resource = {"prefect.resource.id": f"prefect.flow-run.{run_id}",
                "prefect.resource.name": str(flow_run.name)}
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                emit(event=HEARTBEAT_EVENT, resource=resource)
            except Exception:  # a lost beat is the automation's business, not the run's
                logging.getLogger(__name__).debug("heartbeat not sent", exc_info=True)
            if stop.wait(every_seconds):
                return

    # the thread sees this context's Prefect settings (the API the run reports to)
    thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,),
                              name=f"heartbeats-{run_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def beating(fn: F) -> F:
    """The flow function `fn`, sending heartbeats while it runs (under `@flow`: Prefect reads
    the signature and docstring through the wrapper)."""

    @functools.wraps(fn)
    def beating_run(*args: Any, **kwargs: Any) -> Any:
        from store_rollout.settings_outside import one_setting

        # the one setting it needs, read alone: the flow loads (and checks) all of them itself
        with heartbeats(one_setting("heartbeat_seconds")):
            return fn(*args, **kwargs)

    return cast(F, beating_run)


def zombie_automation(heartbeat_seconds: float) -> AutomationCore:
    final = ("Completed", "Failed", "Cancelled", "Crashed")
    return AutomationCore(
        name=AUTOMATION_NAME,
        description="Marks a flow run Crashed when its heartbeats stop (its process died).",
        trigger=EventTrigger(
            after={HEARTBEAT_EVENT},
            expect={HEARTBEAT_EVENT, *(f"prefect.flow-run.{s}" for s in final)},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=zombie_after(heartbeat_seconds)),
        ),
        actions=[ChangeFlowRunState(name=None, state=StateType.CRASHED,
                                    message=crash_message(heartbeat_seconds), force=False)],
    )


def ensure_zombie_automation(heartbeat_seconds: float) -> str:
    return ensure_automation(zombie_automation(heartbeat_seconds))


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
