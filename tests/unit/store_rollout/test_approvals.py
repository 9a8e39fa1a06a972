"""Issue 30, approvals: when a run asks (store_rollout/approval_policy.py), what the approver reads
(the plan of a recreation), and how a run waits for the answer with Prefect's pause, parked
when nobody answers in time (tasks/approvals.py, against a real Prefect server). In the lab,
through the UI: tests/lab/test_approvals_lab.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from store_rollout.approval_policy import approval_needed, approval_request, check_policy
from store_rollout.contracts import (
    STEP_CREATE_VM,
    STEP_FIRSTBOOT,
    STEP_GO_LIVE,
    STEP_NOTIFY_ERP,
)
from store_rollout.fleet.plan import plan_store
from store_rollout.settings import SettingsError, load_settings
from tests.unit.store_rollout.test_fleet_state import UUID, fresh, rolled_out


def test_a_policy_that_is_not_one_is_refused_naming_the_choices() -> None:
    assert check_policy("always") == "always"
    with pytest.raises(ValueError, match=r"approval_policy: 'sometimes' is not a policy; use "
                                         r"one of never, destructive, always"):
        check_policy("sometimes")


def test_the_policy_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORE_ROLLOUT_APPROVAL_POLICY", "sometimes")
    with pytest.raises(SettingsError, match="approval_policy"):
        load_settings()


def test_recreating_an_existing_vm_is_the_destructive_step_and_the_rest_follows() -> None:
    plan = plan_store(rolled_out(), recreate_vm=True)
    assert [p.step for p in plan if p.destructive] == [STEP_CREATE_VM]
    assert [p.step for p in plan if p.todo] == [STEP_CREATE_VM, STEP_FIRSTBOOT, STEP_GO_LIVE,
                                                     STEP_NOTIFY_ERP]
    recreate = next(p for p in plan if p.destructive)
    assert f"remove domain store-0042-vm (uuid {UUID})" in recreate.details[0]
    assert plan[-1].action == "new notice for the new VM"
    # nothing to destroy: a recreation of a store without a VM is a plain creation
    assert not any(p.destructive for p in plan_store(fresh(), recreate_vm=True))
    assert not any(p.destructive for p in plan_store(rolled_out()))


def test_when_a_run_asks() -> None:
    destructive = plan_store(rolled_out(), recreate_vm=True)
    nothing_to_do, some_to_do = plan_store(rolled_out()), plan_store(fresh())
    assert approval_needed("destructive", destructive)
    assert not approval_needed("destructive", some_to_do)
    assert not approval_needed("never", destructive)
    assert approval_needed("always", some_to_do) and not approval_needed("always", nothing_to_do)
    reinstall = plan_store(rolled_out(), reinstall_hypervisor=True)
    assert approval_needed("destructive", reinstall) and not approval_needed("never", reinstall)
    request = approval_request("0042", "destructive", reinstall)
    assert "it would destroy something that works: pxe_install_hypervisor: reinstall " \
           "store-0042-hv" in request, request


def test_moving_a_store_to_a_new_box_is_destructive_even_when_the_old_box_is_dead() -> None:
    """A replacement's facts are the store's with the new box's fields: the old box no longer
    answers, so a plain plan would install without asking; `replace_box` asks first."""
    dead_box = rolled_out(hypervisor_answering=False, hypervisor_ready=False, domain=None,
                          domain_known=False, vm_answering=False, firstboot_stage=None,
                          cobbler_changes=["mac: '52:54:00:00:00:01' -> '52:54:00:00:00:02'"])
    assert not approval_needed("destructive", plan_store(dead_box))
    plan = plan_store(dead_box, replace_box=True)
    assert approval_needed("destructive", plan)
    new_box = plan[1]
    assert new_box.destructive and new_box.todo
    assert new_box.action.startswith("retire the old box, install the new one: update Cobbler "
                                     "system store-0042-hv (1 fields)"), new_box.action
    assert new_box.details[0].startswith("the old box powered off through its BMC")
    assert "mac: '52:54:00:00:00:01' -> '52:54:00:00:00:02'" in new_box.details
    assert [p.step for p in plan if p.todo][1:] == [p.step for p in plan[1:]]


def test_the_approver_reads_why_and_the_plan() -> None:
    text = approval_request("0042", "destructive", plan_store(rolled_out(), recreate_vm=True))
    assert text.startswith("**Store 0042: this rollout waits for your approval**, because it "
                           "would destroy something that works: create_vm: recreate "
                           "store-0042-vm")
    assert "| create_vm | **yes, destructive** |" in text and "Leave it off" in text


def test_the_plan_is_made_only_when_the_policy_may_ask() -> None:
    """approve_rollout plans through the planner the flow hands it (tasks/observe's
    plan_for_approval): never under `never`, nor under `destructive` for a run that asks to
    destroy nothing; asked once otherwise, and a plan with nothing to ask about asks nothing."""
    from tasks.approvals import approve_rollout
    from tests.unit.store_rollout.test_step_rules import STORE

    planned: list[tuple[Any, ...]] = []
    # the approval settings: nobody is asked in these runs, so none is read
    nobody = None

    def planner(*args: Any) -> Any:
        planned.append(args)
        return plan_store(fresh(), recreate_vm=args[1], reinstall_hypervisor=args[2],
                          replace_box=args[3])

    unasked = {"asked": False, "approved": True, "approver": "", "comment": ""}
    assert approve_rollout(STORE, "never", 60, planner, nobody, recreate_vm=True) == unasked
    assert approve_rollout(STORE, "destructive", 60, planner, nobody) == unasked
    assert planned == []
    # a fresh store has no VM to destroy: the plan is read, nothing is asked
    assert approve_rollout(STORE, "destructive", 60, planner, nobody, recreate_vm=True) == unasked
    assert planned == [(STORE, True, False, False)]


def paused_run(answer_after: Any, timeout: float) -> tuple[dict[str, Any], list[str]]:
    """A flow that asks (tasks/approvals.ask) while `answer_after(run id)` answers it from
    another thread; the flow's return and the pause keys its run went through."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    from tasks.approvals import ask

    @flow
    def asks() -> dict[str, Any]:
        started = threading.Thread(target=answer_after, args=(flow_run.id,), daemon=True)
        started.start()
        answer = ask("0042", "**Store 0042** waits", timeout)
        return {"approve": answer.approve, "comment": answer.comment, "id": flow_run.id}

    result = asks()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(result["id"])
    return result, sorted(run.empirical_policy.pause_keys or [])


def answer(approve: bool, comment: str, once: str) -> Any:
    """Resume the run once it is paused under pause key `once`, with that answer."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    def when_paused(run_id: str) -> None:
        with get_client(sync_client=True) as client:
            for _ in range(300):
                state = client.read_flow_run(run_id).state
                if state is not None and state.is_paused() and \
                        state.state_details.pause_key == once:
                    resume_flow_run(run_id, run_input={"approve": approve, "comment": comment})
                    return
                time.sleep(0.2)

    return when_paused


def test_an_answer_in_time_is_returned(prefect_harness: None) -> None:
    result, keys = paused_run(answer(True, "go", once="approval"), timeout=60)
    assert (result["approve"], result["comment"]) == (True, "go")
    assert keys == ["approval"]


def test_no_answer_in_time_ends_a_run_that_cannot_be_parked_saying_how(
        prefect_harness: None) -> None:
    """Issue 43: this run has no deployment to be suspended from: it does not stay paused
    for 30 days; it ends, having changed nothing, naming the deployment to start it from."""
    from tasks.approvals import NoAnswer

    with pytest.raises(NoAnswer, match="no approval within 3 s, and this run cannot wait "
                                       "parked .*prefect deployment run store-rollout"):
        paused_run(lambda run_id: None, timeout=3)


def test_an_answer_given_as_the_pause_ends_is_found_not_asked_again(
        prefect_harness: None) -> None:
    """The answer the first pause's form stored is where `late_answer` reads it (the server
    resumed the run with it while the pause timed out here)."""
    from prefect import flow

    from tasks.approvals import ask, late_answer

    @flow
    def asks_then_reads() -> tuple[Any, Any]:
        import threading

        from prefect.runtime import flow_run

        threading.Thread(target=answer(True, "just in time", once="approval"),
                         args=(flow_run.id,), daemon=True).start()
        given = ask("0042", "**Store 0042** waits", 60)
        return given, late_answer()

    given, found = asks_then_reads()
    assert found is not None and (found.approve, found.comment) == (True, "just in time")
    assert (given.approve, given.comment) == (found.approve, found.comment)
