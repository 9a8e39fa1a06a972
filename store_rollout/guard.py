"""The one gate of every action that can destroy or disrupt a working store.

Reinstalling an installed host, powering one on, recreating or removing a store VM, retiring a
replaced box (its power and keys), decommissioning: each path calls `guard.authorize` (as
`guard.authorize`, never imported by name, so tests/unit/store_rollout/test_guard.py can swap it and
see every path follow) before its first change. It goes on only when
  (a) the action was asked for by name (a run parameter or a command, `Consent.asked`),
  (b) the approval policy agreed (no approval needed under `never`; else the yes of an
      approver proven by a one-time code, on the run's page or with `--yes` at a terminal), and
  (c) the store's maintenance window has room for the whole sequence the action starts (a
      reinstall: steps 2 to 5, not step 2 alone), unless the run overrides windows (`--now`).
It returns what it decided, and the record of who asked, who approved and when, which the
caller logs and keeps in its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from store_rollout import disruption
from store_rollout.contracts import STEP_CREATE_VM, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.disruption import STEP_HARDWARE_REFRESH, STEP_IMAGE_UPDATE
from store_rollout.inventory.calendar_spec import CalendarSpec
from store_rollout.inventory.models import Store


class Action(StrEnum):
    """Each value is the run parameter or command that asks for the action by name."""

    REINSTALL_HOST = "reinstall_hypervisor"
    RECREATE_VM = "recreate_vm"
    REPLACE_BOX = "replace_box"
    ROLLBACK = "rollback"
    DECOMMISSION = "decommission"
    # an installed host found powered off: switched on (from its disk: netboot is off), not
    # reinstalled. The store is down already, so it needs no approval and no window; it is
    # asked for by running the store's rollout at all, and recorded like the others
    POWER_ON_HOST = "power_on_host"
    # a cancelled run's half-made VM of a store that never went live (the ERP knows nothing of
    # it): nothing works yet to disrupt; the cancel asks for it
    CLEAN_UNFINISHED = "clean_unfinished"
    # issue 47: the store server booted on a new system disk (a new image version), or back on
    # its previous one; both keep what they replace (the old system disk, the data disk)
    UPDATE_IMAGE = "update"
    REVERT_IMAGE = "revert"
    # an update a crashed run left switched (recorded on the host) is finished by the rerun:
    # asked for and approved when that run began, in the window it began in
    FINISH_UPDATE = "finish_update"
    # issue 48: the store server moved with its disks onto the store's new box, the old box
    # retired (`store-rollout refresh`)
    REFRESH_HARDWARE = "refresh"


WHAT: Final = {
    Action.REINSTALL_HOST: "reinstalls the store's host (its disk and the store server on it "
                           "are wiped: the store's data disk is lost with it, no export is "
                           "made by a reinstall) and creates the store server anew",
    Action.RECREATE_VM: "destroys the store server VM and creates it anew from the image "
                        "(its data disk is kept)",
    Action.REPLACE_BOX: "powers the old box off (the store's data disk stays on it: no "
                        "export is made), deletes the store's keys and installs the new box "
                        "and its store server with a new, empty data disk",
    Action.ROLLBACK: "destroys the store server VM, its system disk and its key (its data "
                     "disk is kept: only a decommission removes it)",
    Action.DECOMMISSION: "destroys the store server and its data disk (an export of the data "
                         "disk is kept first, unless --no-export), shuts the host down and "
                         "forgets the store in Salt, Cobbler and the ERP",
    Action.POWER_ON_HOST: "powers on the store's installed host, found off (it boots from its "
                          "disk; nothing is reinstalled)",
    Action.CLEAN_UNFINISHED: "removes the half-made store server VM of a store that never "
                             "went live, after its rollout was cancelled (its data disk is "
                             "kept)",
    Action.UPDATE_IMAGE: "shuts the store server down and boots it on a new system disk of "
                         "the new image version (its data disk and its previous system disk "
                         "kept; a failing check reverts it by itself)",
    Action.REVERT_IMAGE: "shuts the store server down and boots it on its previous system "
                         "disk (the version before its last image update)",
    Action.FINISH_UPDATE: "finishes an image update a crashed run left switched: boots the "
                          "store server if it is off, checks it, commits or reverts",
    Action.REFRESH_HARDWARE: "moves the store server to the new box with its disks (live on "
                             "KVM, shut down and copied on Xen), then powers the old box off "
                             "and removes the store's VM and disks from it",
}
# actions that need neither a request, an approval nor a window, and why
UNASKED: Final = {
    Action.POWER_ON_HOST: "nothing runs to disrupt",
    Action.CLEAN_UNFINISHED: "nothing runs to disrupt",
    Action.FINISH_UPDATE: "it finishes what an approved run began in its window and crashed in",
}
UNDISRUPTIVE: Final = frozenset(UNASKED)
# disruptive, but destroying nothing (what they replace is kept): the approval policy
# `destructive` lets them go unapproved; `always` asks
KEEPS_WHAT_IT_REPLACES: Final = frozenset({Action.UPDATE_IMAGE, Action.REVERT_IMAGE})
# seconds the undo actions keep a store down at most (the VM's removal, a graceful shutdown)
UNDO_SECONDS: Final = 900.0


def sequence_seconds(action: Action, disruption_seconds: dict[str, float]) -> float:
    """How long the store is disrupted from the action's start to its end: a reinstall or a
    replacement until the new store server's firstboot is done (steps 2 to 5, each step's
    disruption_seconds), a recreation step 5's, an image update or revert (with a revert
    after a failed check) its own, an undo UNDO_SECONDS."""
    if action in (Action.REINSTALL_HOST, Action.REPLACE_BOX):
        return (disruption_seconds[STEP_PXE_INSTALL_HYPERVISOR]
                + disruption_seconds[STEP_CREATE_VM])
    if action is Action.RECREATE_VM:
        return disruption_seconds[STEP_CREATE_VM]
    if action in KEEPS_WHAT_IT_REPLACES:
        return disruption_seconds[STEP_IMAGE_UPDATE]
    if action is Action.REFRESH_HARDWARE:
        return disruption_seconds[STEP_HARDWARE_REFRESH]
    return 0.0 if action in UNDISRUPTIVE else UNDO_SECONDS


class Consent(BaseModel):
    """What a run or a command carries into the guard: the actions asked for by name, who asked,
    the approval policy and its answer, and whether windows are overridden."""

    model_config = ConfigDict(frozen=True)

    asked: tuple[str, ...] = ()
    asked_by: str = ""
    policy: str = "destructive"
    approved: bool = False
    approver: str = ""  # the approver a one-time code proved (store_rollout/approvers.py)
    approved_by: str = ""
    approved_at: datetime | None = None
    ignore_windows: bool = False

    def asks(self, action: Action) -> bool:
        return action.value in self.asked


# a run that asked for nothing destructive and was approved for nothing
NO_CONSENT: Final = Consent()


class ActionRefused(RuntimeError):
    """A destructive action without its request or its approval: nothing was changed."""

    def __init__(self, store_id: str, action: Action, why: str) -> None:
        super().__init__(f"store {store_id}: {action.value} refused, nothing changed: {why}")
        self.store_id, self.action, self.why = store_id, action, why


@dataclass(frozen=True)
class Authorization:
    """The guard's answer: go now, or wait until `wait_until` (None with go false: no window
    long enough ahead), and the record of the decision."""

    action: str
    go: bool
    reason: str
    wait_until: datetime | None
    record: dict[str, Any]

    def window(self) -> dict[str, Any]:
        """As a step's `window` result (tasks/windows.py waits on it)."""
        return {"go": self.go, "reason": self.reason, "wait_until": self.wait_until,
                "overridden": bool(self.record.get("window_overridden"))}


def calendar_for(store: Store, default: CalendarSpec | None) -> CalendarSpec | None:
    """The store's own calendar, else the chain's default (settings); None: neither."""
    return store.calendar or default


def authorize(action: Action, store: Store, consent: Consent, *,
              disruption_seconds: dict[str, float], default_calendar: CalendarSpec | None,
              now: datetime | None = None) -> Authorization:
    """Whether `action` may start on `store` now (see the module's docstring); raises
    ActionRefused when it was not asked for by name or not approved."""
    now = now or datetime.now(UTC)
    what = WHAT[action]
    if action not in UNDISRUPTIVE and not consent.asks(action):
        raise ActionRefused(store.store_id, action, f"it {what}, and nobody asked for it by "
                            f"name (run parameter or command {action.value})")
    if action in UNDISRUPTIVE:
        approval = f"not needed ({UNASKED[action]})"
    elif consent.policy == "never":
        approval = "not needed (approval policy never)"
    elif consent.policy == "destructive" and action in KEEPS_WHAT_IT_REPLACES \
            and not consent.approved:
        approval = ("not needed (approval policy destructive: it destroys nothing, what it "
                    "replaces is kept)")
    elif consent.approved:
        approval = f"approved by {consent.approved_by or 'the approver'}"
    else:
        raise ActionRefused(store.store_id, action, f"it {what}, and the approval policy "
                            f"{consent.policy!r} needs an approval nobody gave (answer on the "
                            "run's page, or confirm the command with --yes --approver NAME "
                            "--code CODE)")
    if consent.ignore_windows and action not in UNDISRUPTIVE and not consent.approver:
        # a run parameter may tighten the guard, never loosen it: only a person proven by a
        # one-time code may take a live store down outside its window
        raise ActionRefused(store.store_id, action, f"it {what} and ignore_windows overrides "
                            "the store's maintenance window: only a proven approver may do "
                            "that (confirm with --yes --approver NAME --code CODE, or answer on "
                            "the run's page), or let it wait for its window")
    seconds = sequence_seconds(action, disruption_seconds)
    if action in UNDISRUPTIVE:
        window = disruption.WindowDecision(True, f"no window needed: {UNASKED[action]}")
    else:
        window = disruption.decide_sequence(
            action.value, what, calendar_for(store, default_calendar), now,
            timedelta(seconds=seconds), consent.ignore_windows)
    record = {"action": action.value, "store_id": store.store_id, "go": window.go,
              "asked_by": consent.asked_by or "the run", "approval": approval,
              "approver": consent.approver,
              "approved_at": consent.approved_at.isoformat() if consent.approved_at else None,
              "window": window.reason, "window_overridden": window.overridden,
              "sequence_seconds": seconds, "decided_at": now.isoformat()}
    return Authorization(action.value, window.go, window.reason, window.wait_until, record)


def describe(record: dict[str, Any]) -> str:
    """One log line of a decision."""
    return (f"guard: {record['action']} of store {record['store_id']} "
            f"{'goes' if record['go'] else 'waits'}: asked by {record['asked_by']}; "
            f"{record['approval']}; {record['window']}")
