"""Approvals before a rollout destroys something that works (a store VM that exists, recreated
on request), or before any change at all: the policy says when a run asks (`approval_policy`:
a setting, a run and a batch parameter), the plan of the store says what it would do.

The asking itself (a paused run with an input form in Prefect's UI) is tasks/approvals.py's.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from store_rollout.fleet.plan import StepPlan
from store_rollout.fleet.render import plan_markdown

ApprovalPolicy = Literal["never", "destructive", "always"]  # weakest first: the order
APPROVAL_POLICIES: Final = get_args(ApprovalPolicy)
DEFAULT_APPROVAL_POLICY: Final[ApprovalPolicy] = "destructive"
REJECTED: Final = "Rejected"  # the name of a rejected run's final state (a Completed one)
# the final state (a Completed one) of a run that got no answer and could not be parked (a run
# of the CLI has no deployment to resume it from): nothing changed, it needs an approval
NOT_APPROVED: Final = "NotApproved"
# a batch's row of a store whose run waits, parked, for an approval (resumable from its page)
AWAITING_APPROVAL: Final = "AwaitingApproval"
# batch rows that are no failure: the store waits for a person, or a person said no
NOT_FAILED: Final = frozenset({"Completed", REJECTED, NOT_APPROVED, AWAITING_APPROVAL})
# Completed states of a rollout that changed nothing (no approval): not rolled out
UNAPPROVED_ENDS: Final = frozenset({REJECTED, NOT_APPROVED})
# how long a run waits paused for an answer before it is parked (suspended, resumable)
DEFAULT_APPROVAL_TIMEOUT_SECONDS: Final = 3600.0


# how an approver answers the form on the run's page (tasks/approvals.py's Approval)
ANSWER_HOW: Final = (
    "Give your approver name and the one-time code your authenticator shows now. Switch "
    "*Approve* on and submit to go on. Leave it off and submit to reject: the run ends and "
    "changes nothing. A wrong code counts for nothing: the run asks again. Name, answer and "
    "comment go into the store's audit trail.")


def check_policy(value: str, field: str = "approval_policy") -> ApprovalPolicy:
    if value not in APPROVAL_POLICIES:
        raise ValueError(f"{field}: {value!r} is not a policy; use one of "
                         f"{', '.join(APPROVAL_POLICIES)} (never: no approvals; destructive: "
                         "before destroying something that works; always: before any change)")
    return value  # type: ignore[return-value]


def tightened(setting: str, asked: str | None, field: str = "approval_policy") -> ApprovalPolicy:
    """The policy a run follows: the setting (the deployment's, the workers'), or a stricter one
    a run parameter asks for. A weaker one is refused before any side effect: anyone who can
    start a run must not be able to switch approvals off (APPROVAL_POLICIES: weakest first)."""
    floor = check_policy(setting)
    if not asked:
        return floor
    wanted = check_policy(asked, field)
    if APPROVAL_POLICIES.index(wanted) < APPROVAL_POLICIES.index(floor):
        stricter = APPROVAL_POLICIES[APPROVAL_POLICIES.index(floor):]
        raise ValueError(f"{field}: {wanted!r} is weaker than the approval_policy setting "
                         f"{floor!r}; a run may only tighten it: leave {field} empty or use "
                         f"{' or '.join(stricter)} (the setting is changed where the workers' "
                         "settings are)")
    return wanted


def approval_needed(policy: ApprovalPolicy, plan: list[StepPlan]) -> bool:
    """Whether a run with this plan asks first."""
    if policy == "always":
        return any(step.todo for step in plan)
    return policy == "destructive" and any(step.destructive for step in plan)


def approval_request(store_id: str, policy: ApprovalPolicy, plan: list[StepPlan]) -> str:
    """What the approver reads above the form (Markdown): why the run asks and its plan."""
    destructive = [step for step in plan if step.destructive]
    why = ("it would destroy something that works: " + "; ".join(
        f"{step.step}: {step.action}" for step in destructive)) if destructive else (
        f"the approval policy is {policy!r}: every rollout asks before it changes anything")
    return (f"**Store {store_id}: this rollout waits for your approval**, because {why}.\n\n"
            + ANSWER_HOW + "\n\n"
            + plan_markdown({store_id: plan}).removeprefix("# Rollout plan\n"))
