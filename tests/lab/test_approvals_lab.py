"""Issue 30, approvals in the lab, answered in a real browser: a rerun that would recreate a
rolled-out store's VM pauses with the store's plan on its page (and one message to the
operators' channel); rejected, it ends as Rejected with Cobbler, libvirt, Salt and the ERP
unchanged; approved, it recreates the VM and the store is complete again
(`check_approvals`, run by tests/lab/test_ui.py on the store it rolled out from the UI); and
(opt-in, `make test-fleet`) unanswered within its approval timeout, it is parked (suspended)
and an answer later still ends it; a requested reinstall of a ready host asks the same way,
and approved, reinstalls it. Issue 44: every answer names an approver and carries a one-time
code of theirs (lab/approvers.py); an answer with a wrong code is refused and the run asks
again, and the store's audit trail names who decided."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lab.approvers import approver_code, audit_dir
from lab.prefect_access import PrefectAccess, api_session
from lab.state import LabInfo
from store_rollout import audit
from tests.helpers import (
    check_store,
    created_erp_notices,
    finish,
    notifications,
    power_actions,
    result_from_systems,
    start_rollout,
    wait_for,
    write_inventory,
)
from tests.lab.test_plan_reconcile import systems_snapshot

if TYPE_CHECKING:  # tests/lab/test_ui.py runs check_approvals
    from tests.lab.test_ui import Ui

pytestmark = pytest.mark.lab



def run(lab: LabInfo, run_id: str) -> dict[str, Any]:
    return dict(api_session(lab).get(f"{lab.prefect_api_url}/flow_runs/{run_id}", timeout=10).json())


def recreate_run(lab: LabInfo, inventory: Path, store_id: str, **extra: Any) -> str:
    """A rerun of the store that recreates its VM, started from the deployment (as the UI's
    run form does); its id once it waits for the answer (Paused)."""
    api = lab.prefect_api_url
    deployment = api_session(api).get(f"{api}/deployments/name/store-rollout/store-rollout",
                              timeout=10).json()
    created = api_session(api).post(f"{api}/deployments/{deployment['id']}/create_flow_run", json={
        "parameters": {"store_id": store_id, "inventory": str(inventory), "recreate_vm": True,
                       **extra}}, timeout=10).json()
    wait_for(lambda: run(lab, created["id"])["state_type"] == "PAUSED", timeout=180,
             what="the recreating run to wait for its approval")
    return str(created["id"])


def proven(lab: LabInfo, approve: bool, comment: str, name: str = "ana",
           code: str | None = None) -> dict[str, Any]:
    """An answer of the lab approver `name` with a code of theirs (or `code`, e.g. a wrong one)."""
    return {"approve": approve, "approver": name, "comment": comment,
            "code": code if code is not None else approver_code(lab, name)}


def answer_in_the_ui(lab: LabInfo, ui: Ui, run_id: str, approve: bool, comment: str,
                     shot: str) -> str:
    """Open the paused run's page, read what it asks, answer in its form; returns the text the
    approver read."""
    ui.goto(f"/runs/flow-run/{run_id}")
    ui.page.get_by_role("button", name="Resume").click()
    ui.page.get_by_text("this rollout waits for your approval").wait_for()
    form = ui.page.get_by_role("dialog")
    asked = str(form.inner_text())
    if approve:
        form.get_by_role("switch").click()
    # the form's text fields in the order of tasks/approvals.Approval: approver, code, comment
    fields = form.locator("textarea, input[type=text]")
    fields.nth(0).fill("ana")
    fields.nth(1).fill(approver_code(lab, "ana"))
    fields.nth(2).fill(comment)
    ui.shot(shot)
    ui.page.get_by_role("button", name="Submit").click()
    return asked


def approval_request_of(lab: LabInfo, run_id: str) -> str:
    """What the paused run's form says above it (its run input's description), as the API
    holds it for the UI."""
    keyset = run(lab, run_id)["state"]["state_details"]["run_input_keyset"]
    text = api_session(lab).get(f"{lab.prefect_api_url}/flow_runs/{run_id}/input/{keyset['description']}",
                        timeout=10).text
    return str(json.loads(text)) if text.startswith('"') else text


def ended(lab: LabInfo, run_id: str) -> dict[str, Any]:
    return wait_for(lambda: (r := run(lab, run_id))["state_type"] in (
        "COMPLETED", "FAILED", "CRASHED", "CANCELLED") and r, timeout=300, interval=1,
        what="the run to end")


def check_approvals(lab: LabInfo, ui: Ui, inventory: Path, store: str) -> None:
    """On a rolled-out store: a recreating rerun rejected, then one approved, in the browser."""
    first_vm = result_from_systems(lab, store)["vm"]["uuid"]
    first_erp = [n["erp_id"] for n in created_erp_notices(lab, store)]
    # rejected: the run ends as Rejected, every system as it was
    before = systems_snapshot(lab)
    rejected = recreate_run(lab, inventory, store)
    said = wait_for(lambda: notifications(lab, f"rollout-{store}: waits for your approval"),
                    timeout=60, what="the approval's message")
    assert f"/runs/flow-run/{rejected}" in said[0]["body"], said
    asked = answer_in_the_ui(lab, ui, rejected, approve=False, comment="not during the sale",
                             shot="approval-form")
    assert f"recreate store-{store}-vm" in asked and "yes, destructive" in asked, asked
    end = ended(lab, rejected)
    assert (end["state_type"], end["state_name"]) == ("COMPLETED", "Rejected"), end["state"]
    assert "not during the sale" in end["state"]["message"]
    after = systems_snapshot(lab)
    for system in before:
        assert after[system] == before[system], f"a rejected run changed {system}"
    assert len(notifications(lab, f"rollout-{store}: waits for your approval")) == 1

    # approved: the VM is recreated and the store complete again, with a new ERP notice
    approved = recreate_run(lab, inventory, store)
    answer_in_the_ui(lab, ui, approved, approve=True, comment="approved by the store manager",
                     shot="approval-approved")
    assert ended(lab, approved)["state_name"] == "Completed"
    trail = [(r["action"], r["person"], r["decision"]) for r in audit.read(audit_dir(lab), store)]
    assert trail[-3:] == [("recreate_vm", "ana", "rejected"), ("recreate_vm", "ana", "approved"),
                          ("recreate_vm", "ana", "done")], trail
    result = result_from_systems(lab, store)
    assert result["vm"]["uuid"] != first_vm
    notices = [n["erp_id"] for n in created_erp_notices(lab, store)]
    assert notices[:-1] == first_erp and len(notices) == 2
    check_store(lab, store, {**result, "erp_id": notices[-1]}, vms=2)


@pytest.mark.fleet
def test_an_unanswered_approval_parks_the_run_and_a_later_answer_ends_it(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    store = "apr-park"
    inventory = write_inventory(tmp_path / "inventory.yaml", [store], "52:54:00:a9:00", lab=lab)
    finish(start_rollout(lab_env, store, inventory))
    before = systems_snapshot(lab)
    parked = recreate_run(lab, inventory, store, approval_timeout=3)
    wait_for(lambda: run(lab, parked)["state_name"] == "Suspended", timeout=60,
             what="the unanswered run to be parked")
    keyset = run(lab, parked)["state"]["state_details"]["run_input_keyset"]
    assert keyset, "a parked run keeps its form"
    # answered once its process is gone: Prefect 3.8.8's worker dies when it is handed a
    # resumed run whose earlier process it still holds a slot for (docs/production.md)
    pid = int(str(run(lab, parked)["infrastructure_pid"]).rsplit(":", 1)[-1])
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=60,
             what="the parked run's process to end")
    time.sleep(3)  # the worker's next poll (2 s) finds the process gone and frees the slot
    api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/{parked}/resume", json={
        "run_input": proven(lab, False, "next week")}, timeout=10).raise_for_status()
    end = ended(lab, parked)
    assert end["state_name"] == "Rejected" and "next week" in end["state"]["message"], end["state"]
    after = systems_snapshot(lab)
    for system in before:
        assert after[system] == before[system], f"a parked, then rejected run changed {system}"


@pytest.mark.fleet
def test_a_requested_reinstall_asks_first_then_wipes_the_host_and_redoes_the_store(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    """`reinstall_hypervisor` of a rolled-out store, started from the deployment as the UI's
    form does: it pauses with step 2 marked destructive; approved, the running host is
    installed again through its BMC, which wipes its disk and the store server on it, and the
    steps after it run as for a new host: a new VM, key and ERP notice."""
    store = "apr-reinst"
    inventory = write_inventory(tmp_path / "inventory.yaml", [store], "52:54:00:a8:00", lab=lab)
    first = finish(start_rollout(lab_env, store, inventory))
    paused = recreate_run(lab, inventory, store, recreate_vm=False, reinstall_hypervisor=True)
    asked = approval_request_of(lab, paused)
    assert f"pxe_install_hypervisor: reinstall store-{store}-hv" in asked, asked
    # issue 44: an answer with a wrong code counts for nothing: the run asks again
    api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/{paused}/resume", json={
        "run_input": proven(lab, True, "forged", code="000000")}, timeout=10).raise_for_status()
    wait_for(lambda: run(lab, paused)["state_type"] == "PAUSED" and run(lab, paused)[
        "state"]["state_details"]["pause_key"] == "approval-2", timeout=60,
        what="the run to ask again after a wrong code")
    assert power_actions(lab, f"store-{store}-hv") == {"on": 1, "off": 0}  # nothing done
    api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/{paused}/resume", json={
        "run_input": proven(lab, True, "new disk controller")}, timeout=10).raise_for_status()
    assert ended(lab, paused)["state_name"] == "Completed"
    # the running host powered off and on into the install (the first rollout: on only)
    assert power_actions(lab, f"store-{store}-hv") == {"on": 2, "off": 1}
    result = result_from_systems(lab, store)
    assert result["vm"]["uuid"] != first["vm"]["uuid"]
    notices = [n["erp_id"] for n in created_erp_notices(lab, store)]
    assert notices[0] == first["erp_id"] and len(notices) == 2
    check_store(lab, store, {**result, "erp_id": notices[-1]}, vms=2)


@pytest.mark.fleet
def test_a_batch_with_a_parked_approval_ends_and_names_the_store_that_waits(
        lab: LabInfo, lab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43: under the "always" policy a store's run that gets no answer does not keep
    its batch waiting forever: the batch ends, its table saying the store needs an approval
    (no failure)."""
    from lab.state import LabPaths

    store = "apr-batch"
    inventory = write_inventory(tmp_path / "inventory.yaml", [store], "52:54:00:a9:10", lab=lab)
    monkeypatch.setenv("STORE_ROLLOUT_SETTINGS_FILE", str(LabPaths(lab_dir).settings_file))
    with PrefectAccess.of(lab).settings():
        from flows.batch_rollout import batch_rollout

        state = batch_rollout(str(inventory), (store,), approval_policy="always",
                              store_params={"approval_timeout": 3.0}, return_state=True)
    assert state.is_completed(), state.message
    rows = state.result()
    # a batch's store run is a subflow run, which Prefect cannot suspend: unanswered, it
    # ends NotApproved (nothing changed), the batch with it, saying how to get an answer
    assert [(r["store_id"], r["state"]) for r in rows] == [(store, "NotApproved")], rows
    assert "no approval within 3 s" in rows[0]["error"], rows
    assert "run the batch again once someone can answer" in rows[0]["error"], rows
    assert run(lab, rows[0]["flow_run_id"])["state_name"] == "NotApproved"
    assert power_actions(lab, f"store-{store}-hv") == {"on": 0, "off": 0}  # nothing done


@pytest.mark.fleet
def test_cancelling_a_batch_leaves_its_live_stores_as_they_are(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    """Issue 43: a batch's store runs of live stores, waiting for their approval, cancelled
    with the batch: every live store is left as it was (no rollback of any)."""
    from tests.lab.test_windows_lab import cancel, deployment_id

    stores = ["apr-bc1", "apr-bc2"]
    inventory = write_inventory(tmp_path / "inventory.yaml", stores, "52:54:00:a9:20", lab=lab)
    import libvirt

    for store in stores:
        finish(start_rollout(lab_env, store, inventory))
    # their store servers down (a rerun would start them): under "always" their runs ask
    conn = libvirt.open(lab.libvirt_uri)
    try:
        for store in stores:
            conn.lookupByName(f"store-{store}-vm").destroy()
    finally:
        conn.close()
    before = systems_snapshot(lab)
    batch = api_session(lab).post(
        f"{lab.prefect_api_url}/deployments/{deployment_id(lab, 'batch-rollout/batch-rollout')}"
        "/create_flow_run", json={"parameters": {
            "inventory": str(inventory), "canary": 2, "approval_policy": "always",
            "rerun_completed": True}}, timeout=10).json()

    def children() -> list[dict[str, Any]]:
        return list(api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
            "flow_runs": {"name": {"any_": [f"rollout-{s}" for s in stores]},
                          "state": {"type": {"any_": ["PAUSED"]}}}}, timeout=10).json())

    wait_for(lambda: len(children()) == 2, timeout=180, what="both stores' runs to ask")
    paused = [c["id"] for c in children()]
    cancel(lab, batch["id"])
    for run_id in paused:
        wait_for(lambda r=run_id: run(lab, r)["state_type"] == "CANCELLED", timeout=120,
                 what="the batch's store run cancelled with it")
    after = systems_snapshot(lab)
    for system in before:
        assert after[system] == before[system], f"a cancelled batch changed {system}"
