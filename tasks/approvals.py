"""Asking a person before a rollout goes on (store_rollout/approval_policy.py says when): the run
pauses with Prefect's `pause_flow_run(wait_for_input=...)`, and its page in the UI shows the
store's plan above a form (approver name, one-time code, approve, comment): an answer counts
only once its code proves the approver (tasks/approvers.py); a wrong one is logged ("approval
refused: code wrong for ...") and the run asks again. Every answer goes into the store's audit
trail (tasks/audit.py). No answer within the approval timeout parks the
run: suspended (its process ends), resumable from the same form at any time (a batch counts it
as waiting for an approval, not as a failure); an answer given as the pause ends is kept. A run
without a deployment to resume it from (the CLI's) cannot be parked: it ends NotApproved, having
changed nothing, saying how to start it through the deployment. Never failed for want of an
answer.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run, suspend_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field

from store_rollout.approval_policy import ANSWER_HOW, ApprovalPolicy, approval_needed, approval_request
from store_rollout.approvers import ApproverError
from store_rollout.fleet.plan import StepPlan
from store_rollout.guard import WHAT, Action, Consent
from store_rollout.inventory import Store
from store_rollout.settings_parts import ApprovalSettings
from tasks.approvers import prove
from tasks.audit import record
from tasks.run_health import run_logger, say_running

ASK_KEY: Final = "approval"
PARK_KEY: Final = "approval-parked"
PARKED_PAUSE_SECONDS: Final = 30 * 24 * 3600  # a run that cannot be suspended stays paused
POLL_SECONDS: Final = 2  # how soon a paused run sees its answer (one API read each)
TRIES: Final = 5  # answers without a good code before the run gives up (nothing changed)
# what makes the store's plan for its approval (store, recreate_vm, reinstall_hypervisor,
# replace_box): tasks/observe.plan_for_approval, which the rollout flow hands approve_rollout
Planner = Callable[[Store, bool, bool, bool], list[StepPlan]]


class Approval(RunInput):
    """The approver's answer (the form on the paused run's page)."""

    approve: bool = Field(False, description="On: the rollout goes on. Off: the run ends and "
                                             "changes nothing.")
    approver: str = Field("", max_length=64, description="Your approver name")
    code: str = Field("", max_length=16, description="The one-time code your authenticator "
                                                     "shows now")
    comment: str = Field("", max_length=2000, description="Why (kept in the run's log)")


def _parked_before(key: str) -> bool:
    context = FlowRunContext.get()
    policy = context.flow_run.empirical_policy if context and context.flow_run else None
    return key in (getattr(policy, "pause_keys", None) or set())


def keys(attempt: int) -> tuple[str, str]:
    """The pause and the park key of the `attempt`th question (each asked once: Prefect hands
    a key's stored answer back instead of pausing again)."""
    more = f"-{attempt + 1}" if attempt else ""
    return ASK_KEY + more, PARK_KEY + more


class NoAnswer(Exception):
    """No answer within the timeout, and the run cannot be parked (no deployment)."""


def ask(store_id: str, request: str, timeout: float, attempt: int = 0) -> Approval:
    """The approver's answer; paused for `timeout` seconds, then parked (suspended) until one
    comes. An answer given as the timeout fires is kept, not asked for again. A run that
    cannot be parked (the CLI's: no deployment to resume it from) raises NoAnswer."""
    form = Approval.with_initial_data(description=request, approve=False)
    logger = run_logger(__name__)
    ask_key, park_key = keys(attempt)
    if not _parked_before(park_key):  # a parked run that was resumed starts again from the top
        logger.warning("store %s: waiting up to %.0f s for an approval on the run's page: %s",
                       store_id, timeout, flow_run.ui_url or f"flow run {flow_run.id}")
        try:
            return pause_flow_run(wait_for_input=form, timeout=int(timeout), key=ask_key,
                                  poll_interval=POLL_SECONDS)
        except FlowPauseTimeout:
            late = late_answer(ask_key)
            if late is not None:
                logger.warning("store %s: the answer came as the wait ended: kept", store_id)
                return late
            logger.warning("store %s: no answer within %.0f s: the run is parked (suspended); "
                           "answer on its page to resume it", store_id, timeout)
            say_running("Running")  # Prefect suspends only a running run; the pause ran out
    try:
        return suspend_flow_run(wait_for_input=form, key=park_key)
    except RuntimeError as exc:  # no deployment to resume it from, or a batch's store run
        how = ("run the batch again once someone can answer (it goes on with the stores it "
               "did not roll out), or start the store's run from the deployment"
               if "subflow" in str(exc).lower() else "start it through the deployment")
        raise NoAnswer(
            f"store {store_id}: no approval within {timeout:.0f} s, and this run cannot wait "
            f"parked ({exc}): nothing changed. To have it wait for its approval, {how} "
            f"(`prefect deployment run store-rollout/store-rollout -p store_id={store_id} "
            f"-p inventory=<file>`), or approve sooner") from None


def late_answer(key: str = ASK_KEY) -> Approval | None:
    """The answer to the first pause's form, if one was given as its wait ended (the server
    resumed the run with it while the pause timed out here)."""
    from prefect.input import keyset_from_base_key
    from prefect.input.actions import read_flow_run_input

    keyset = keyset_from_base_key(f"paused-{key}")
    value: Any = read_flow_run_input(keyset["response"])
    return Approval(**value) if value else None


def ask_proven(store_id: str, action: str, request: str, timeout: float,
               settings: ApprovalSettings) -> tuple[Approval, str]:
    """An answer whose code proves its approver, and the approver's name; an answer without
    one counts for nothing (logged, in the audit trail as refused) and the run asks again,
    TRIES times at most (then NoAnswer: nothing changed). Rejecting needs a proof too."""
    logger = run_logger(__name__)
    asked = request
    for attempt in range(TRIES):
        answer = ask(store_id, asked, timeout, attempt)
        try:
            proven = prove(settings, answer.approver, answer.code)
        except ApproverError as exc:
            logger.warning("store %s: approval refused: %s; asking again on the run's page",
                           store_id, exc)
            record(settings, store_id, action, "", "refused",
                   f"an answer as {answer.approver.strip()!r} without a good code: {exc}")
            asked = f"**The last answer was refused: {exc}.** Answer again.\n\n{request}"
            continue
        decision = "approved" if answer.approve else "rejected"
        logger.warning("store %s: %s %s by %s (one-time code checked)%s", store_id, action,
                       decision, proven.name, f": {answer.comment}" if answer.comment else "")
        record(settings, store_id, action, proven.name, decision, answer.comment)
        return answer, proven.name
    raise NoAnswer(f"store {store_id}: {TRIES} answers without a good one-time code: nothing "
                   "changed; start the run again once the approver's authenticator is right")


def proven_yes(store_id: str, action: str, approver: str, code: str,
               settings: ApprovalSettings) -> dict[str, Any]:
    """A `--yes` at a terminal, as the run itself checks it (anyone who reaches the API could
    start a run naming any approver): the approval of the proven approver, or ApproverError
    before any side effect. The code is used up here."""
    proven = prove(settings, approver, code)
    record(settings, store_id, action, proven.name, "approved",
           "confirmed with --yes and a one-time code")
    return {"asked": True, "approved": True, "approver": proven.name,
            "comment": f"confirmed by {proven.name} with --yes and a one-time code"}


def asked_actions(recreate_vm: bool, reinstall_hypervisor: bool, replace_box: bool) -> str:
    """The audit trail's action of a rollout's approval: what it asks for by name."""
    return ", ".join(action.value for action, wanted in (
        (Action.RECREATE_VM, recreate_vm), (Action.REINSTALL_HOST, reinstall_hypervisor),
        (Action.REPLACE_BOX, replace_box)) if wanted) or "rollout"


def approve_rollout(store: Store, policy: ApprovalPolicy, timeout: float, planner: Planner,
                    approvals: ApprovalSettings, *, recreate_vm: bool = False,
                    reinstall_hypervisor: bool = False, replace_box: bool = False
                    ) -> dict[str, Any]:
    """Ask first when the policy wants it for this run: {"asked", "approved", "approver",
    "comment"}. Called from the flow itself (a task cannot pause its flow). `planner` makes the
    store's plan, called only when the policy may ask (the flow hands it
    tasks/observe.plan_for_approval)."""
    asked_to_destroy = recreate_vm or reinstall_hypervisor or replace_box
    unasked = {"asked": False, "approved": True, "approver": "", "comment": ""}
    if policy == "never" or (policy == "destructive" and not asked_to_destroy):
        return unasked  # nothing to destroy: no read
    plan = planner(store, recreate_vm, reinstall_hypervisor, replace_box)
    if not approval_needed(policy, plan):
        return unasked
    try:
        answer, name = ask_proven(store.store_id, asked_actions(
            recreate_vm, reinstall_hypervisor, replace_box),
            approval_request(store.store_id, policy, plan), timeout,
            approvals)
    except NoAnswer as exc:
        run_logger(__name__).warning("%s", exc)
        return {"asked": True, "approved": False, "not_approved": True, "approver": "",
                "comment": str(exc)}
    return {"asked": True, "approved": answer.approve, "approver": name,
            "comment": answer.comment}


def rollout_consent(policy: ApprovalPolicy, approval: dict[str, Any], *, ignore_windows: bool,
                    recreate_vm: bool = False, reinstall_hypervisor: bool = False,
                    replace_box: bool = False) -> Consent:
    """What this rollout carries into the guard (store_rollout/guard.py): the destructive
    actions its parameters ask for by name, the run that asked, and the proven approver's
    answer (approved only when one was asked for and given)."""
    asked = tuple(action.value for action, wanted in (
        (Action.RECREATE_VM, recreate_vm), (Action.REINSTALL_HOST, reinstall_hypervisor),
        (Action.REPLACE_BOX, replace_box)) if wanted)
    name = flow_run.name or "this run"
    approver = approval.get("approver", "")
    return Consent(asked=asked, asked_by=f"run {name} (parameters: {', '.join(asked) or 'none'})",
                   policy=policy, approved=bool(approval["asked"] and approval["approved"]),
                   approver=approver,
                   approved_by=(f"{approver or 'nobody'} (one-time code checked)"
                                + (f" ({approval['comment']})" if approval["comment"] else "")),
                   approved_at=datetime.now(UTC) if approval["asked"] else None,
                   ignore_windows=ignore_windows)


def undo_consent(store: Store, action: Action, policy: ApprovalPolicy, timeout: float,
                 settings: ApprovalSettings, *, asked_by: str, approver: str = "", code: str = "",
                 ignore_windows: bool = False) -> Consent:
    """The consent of a rollback or decommission, asked for by name (the command or the run):
    with `approver` and `code` (`--yes` at a terminal) approved by that approver once the
    code proves them (here, in the run: a wrong code fails the run before it changes
    anything); else, under a policy other than never, asked on the run's page like a
    rollout's approval. A rejection is a consent without approval: the guard refuses."""
    base = Consent(asked=(action.value,), asked_by=asked_by, policy=policy,
                   ignore_windows=ignore_windows)
    if approver or code:
        yes = proven_yes(store.store_id, action.value, approver, code, settings)
        return base.model_copy(update={
            "approved": True, "approved_at": datetime.now(UTC), "approver": yes["approver"],
            "approved_by": f"{yes['approver']} (one-time code checked, confirmed with --yes)"})
    if policy == "never":
        return base
    request = (f"**Store {store.store_id}: {action.value} waits for your approval.** It "
               f"{WHAT[action]}.\n\n{ANSWER_HOW}")
    answer, name = ask_proven(store.store_id, action.value, request, timeout, settings)
    return base.model_copy(update={
        "approved": answer.approve, "approved_at": datetime.now(UTC), "approver": name,
        "approved_by": f"{name} (one-time code checked)"
                       + (f" ({answer.comment})" if answer.comment else "")})


def update_consent(store: Store, action: Action, policy: ApprovalPolicy, timeout: float,
                   settings: ApprovalSettings, *, asked_by: str, approver: str = "",
                   code: str = "", ignore_windows: bool = False) -> Consent:
    """The consent of an image update or revert (asked for by name: the command or the run):
    as a rollback's (undo_consent), but under the policy destructive nobody is asked, as it
    destroys nothing (the system disk it replaces and the data disk are kept; the guard says
    so); `always` asks, and a `--yes` approver is proven all the same."""
    if policy == "destructive" and not (approver or code):
        return Consent(asked=(action.value,), asked_by=asked_by, policy=policy,
                       ignore_windows=ignore_windows)
    return undo_consent(store, action, policy, timeout, settings, asked_by=asked_by,
                        approver=approver, code=code, ignore_windows=ignore_windows)
