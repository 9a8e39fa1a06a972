"""What the undo flows (rollback, decommission, a cancelled rollout's clean-up) decide before
they change anything: whether a cancelled rollout's store is left as it is, and the guard's
go (store_rollout/guard.py), each logged and, where it ends the run, in the audit trail."""

from __future__ import annotations

from prefect import get_run_logger

from store_rollout import guard, step_rules
from store_rollout.guard import Action, Authorization, Consent
from store_rollout.inventory import Store
from store_rollout.settings_parts import ApprovalSettings, CalendarSettings, ErpSettings
from tasks.audit import record
from tasks.erp import ErpError, erp_client


def cancel_leaves_as_is(store_id: str, erp: ErpSettings,
                        approvals: ApprovalSettings) -> str | None:
    """Why a cancelled rollout's clean-up leaves the store as it is: the ERP does not answer,
    or the store is live (the ERP knows it); logged and recorded. None: the store never went
    live, and its half-made VM goes."""
    logger = get_run_logger()
    try:
        live = step_rules.store_live(erp_client(erp).notices(store_id))
    except ErpError as exc:
        logger.warning("store %s: cancelled; the ERP did not answer (%s): the store is left "
                       "as it is", store_id, exc)
        record(approvals, store_id, "cancel", "", "left as is", f"ERP unreadable: {exc}")
        return f"ERP unreadable: {exc}"
    if not live:
        return None
    logger.warning("store %s: cancelled; the store is live (the ERP knows it): left as it is. "
                   "Undo it with `store-rollout rollback` if that is wanted", store_id)
    record(approvals, store_id, "cancel", "", "left as is", "live store")
    return "live store"


def undo_decision(action: Action, store: Store, consent: Consent,
                   settings: CalendarSettings, consequence: str = "") -> Authorization:
    """The guard's decision on an undo of `store`, logged with its `consequence` (what it does
    to the store's data disk, store_rollout/data_disk.py); ActionRefused (nothing changed)
    unless it goes now."""
    decision = guard.authorize(action, store, consent,
                               disruption_seconds=settings.disruption_seconds,
                               default_calendar=settings.default_calendar)
    get_run_logger().warning("store %s: %s%s", store.store_id, guard.describe(decision.record),
                             f"; {consequence}" if consequence else "")
    if not decision.go:
        raise guard.ActionRefused(store.store_id, action, decision.reason)
    return decision
