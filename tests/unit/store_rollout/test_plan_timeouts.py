"""Plan and run agree on step 2 under the run's own hypervisor_timeout.

Step 2 leaves a host that an earlier run powered on into its install alone while that install
is younger than the run's `hypervisor_timeout` (its `install_seconds`). The plan (the one an
approver reads inside the run, and `store-plan`'s) used the default timeout instead: for a run
started with a longer one, it said step 2 would power-cycle a host the run would leave to its
install. Here the plan takes the run's timeout: in the facts it reads (the BMC asked within
it), in the approval's plan of a run, and in the flows' wiring.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from store_rollout import step_rules
from store_rollout.contracts import POWER_CYCLED_META, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.fleet.facts import StoreFacts
from store_rollout.fleet.plan import StepPlan, plan_store
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks import approvals, observe
from tests.helpers import REPO_ROOT
from tests.unit.store_rollout.test_step_rules import STORE, facts

LONGER = STEP_TIMEOUTS.hypervisor_timeout * 2  # a run's own hypervisor_timeout
# between the default timeout and the run's: underway for the run, over for the default
# (taken at each use: a module imported at collection may run its tests many minutes later)
def cycled() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=STEP_TIMEOUTS.hypervisor_timeout * 1.5)


def installing(**changes: Any) -> StoreFacts:
    """A host powered on into its install cycled() ago, on now, not installed yet."""
    return facts(hypervisor_key=None, hypervisor_ready=False, hypervisor_answering=False,
                 cobbler_netboot=True, power_cycled_at=cycled(), host_powered_on=True,
                 **changes)


def step2(plan: list[StepPlan]) -> StepPlan:
    return next(p for p in plan if p.step == STEP_PXE_INSTALL_HYPERVISOR)


def test_the_plan_leaves_an_install_alone_as_long_as_the_run_would() -> None:
    # what step 2 itself decides, with the run's install_seconds and with the default
    assert step_rules.install_underway(cycled(), datetime.now(UTC), LONGER, True)
    assert not step_rules.install_underway(cycled(), datetime.now(UTC),
                                           STEP_TIMEOUTS.hypervisor_timeout, True)
    assert not step2(plan_store(installing(install_seconds=LONGER))).todo
    assert "underway" in step2(plan_store(installing(install_seconds=LONGER))).action
    assert step2(plan_store(installing())).todo  # the default timeout: a new power cycle


class FakeBmc:
    def power_state(self) -> str:
        return "on"


def test_the_bmc_is_asked_while_the_runs_install_may_be_underway(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observe, "bmc_client", lambda _store, _settings: FakeBmc())
    record = {"netboot_enabled": True,
              "autoinstall_meta": {POWER_CYCLED_META: cycled().isoformat()}}
    settings = SimpleNamespace()
    assert observe._host_on(STORE, settings, record, None, None, LONGER) is True  # type: ignore[arg-type]
    # past the default timeout: the power is not asked (the plan says step 2 power-cycles)
    assert observe._host_on(STORE, settings, record, None, None,  # type: ignore[arg-type]
                            STEP_TIMEOUTS.hypervisor_timeout) is None


def test_the_approvers_plan_is_the_runs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan a run shows its approver is planned with the run's hypervisor_timeout."""
    observed: list[float] = []

    def fake_observe(stores: list[Any], _settings: Any, **kwargs: Any) -> dict[str, StoreFacts]:
        observed.append(kwargs["install_seconds"])
        return {s.store_id: installing(install_seconds=kwargs["install_seconds"]) for s in stores}

    monkeypatch.setattr(observe, "observe", fake_observe)
    plan = observe.plan_for_approval.fn(STORE, False, settings=SimpleNamespace(),
                                        install_seconds=LONGER)
    assert observed == [LONGER] and not step2(plan).todo

    asked: list[Any] = []
    monkeypatch.setattr(approvals, "ask_proven", lambda *args: (
        approvals.Approval(approve=True, approver="ann"), "ann"))
    approval = approvals.approve_rollout(
        STORE, "always", 60, lambda *args: asked.append(args) or plan, SimpleNamespace())
    assert approval["approved"] and asked == [(STORE, False, False, False)]


def keywords_of_calls(path: str, function: str) -> list[dict[str, str]]:
    """The keyword arguments (as source) of each call of `function` in a module."""
    tree = ast.parse((REPO_ROOT / path).read_text())
    return [{kw.arg or "**": ast.unparse(kw.value) for kw in node.keywords}
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func) == function]


def test_the_flows_hand_the_runs_timeout_to_the_plan() -> None:
    # the rollout: its approval's plan and its step 2 take the run's hypervisor_timeout
    assert [kw.get("install_seconds") for kw in
            keywords_of_calls("flows/rollout.py", "partial")] == ["hypervisor_timeout"]
    assert [kw.get("install_seconds") for kw in keywords_of_calls(
        "flows/rollout.py", "clock.run")
        if "install_seconds" in kw] == ["hypervisor_timeout"]
    # store-plan: the facts of the rollout planned, with its hypervisor_timeout
    assert [kw.get("install_seconds") for kw in
            keywords_of_calls("flows/plan.py", "observe_stores")] == ["hypervisor_timeout"]
