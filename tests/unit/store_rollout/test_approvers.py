"""Issue 44: only named people act. An approval counts only when a one-time code (TOTP) proves
its approver (store_rollout/approvers.py, tasks/approvers.py): a wrong, expired or reused code
is refused, on the run's page and at a terminal; every approval, rejection, cancel, rollback,
replace and decommission is in the store's append-only audit trail naming the proven person
(store_rollout/audit.py, tasks/audit.py); a run parameter may only tighten the approval policy.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyotp
import pytest

from store_rollout import audit
from store_rollout.approval_policy import tightened
from store_rollout.approvers import CODES_FILE, ApproverError, next_code, verify
from tests.helpers import settings_with

SEED = pyotp.random_base32()
SEEDS = {"ana": SEED, "ben": pyotp.random_base32()}
NOW = datetime(2026, 11, 27, 12, 0, 10, tzinfo=UTC)


def code_at(when: datetime, seed: str = SEED) -> str:
    return pyotp.TOTP(seed).at(when)


def test_a_good_code_proves_its_approver_once(tmp_path: Path) -> None:
    proven = verify(SEEDS, "ana", code_at(NOW), tmp_path, now=NOW)
    assert proven.name == "ana"
    # the same code again (replayed from a log, a form, a shoulder) is refused
    with pytest.raises(ApproverError, match="code wrong for 'ana': this code .* was used"):
        verify(SEEDS, "ana", code_at(NOW), tmp_path, now=NOW + timedelta(seconds=5))
    # another approver's codes are their own
    assert verify(SEEDS, "ben", code_at(NOW, SEEDS["ben"]), tmp_path, now=NOW).name == "ben"
    # the used steps file is the approvers' only state: 0600 from its creation
    assert stat.S_IMODE((tmp_path / CODES_FILE).stat().st_mode) == 0o600


def test_a_wrong_unknown_or_expired_code_is_refused(tmp_path: Path) -> None:
    good = code_at(NOW)
    wrong = f"{(int(good) + 1) % 10**6:06d}"
    with pytest.raises(ApproverError, match=r"^code wrong for 'ana' \(or expired\)"):
        verify(SEEDS, "ana", wrong, tmp_path, now=NOW)
    with pytest.raises(ApproverError, match="approver 'eve' unknown"):
        verify(SEEDS, "eve", good, tmp_path, now=NOW)
    with pytest.raises(ApproverError, match="no approver named"):
        verify(SEEDS, "", good, tmp_path, now=NOW)
    with pytest.raises(ApproverError, match="code wrong for 'ben'"):  # ana's code, ben's name
        verify(SEEDS, "ben", good, tmp_path, now=NOW)
    # one step of clock drift either side is accepted (valid_window=1), two are not
    with pytest.raises(ApproverError, match="code wrong for 'ana'"):
        verify(SEEDS, "ana", code_at(NOW - timedelta(seconds=60)), tmp_path, now=NOW)
    assert verify(SEEDS, "ana", code_at(NOW - timedelta(seconds=30)), tmp_path, now=NOW)
    assert not (tmp_path / CODES_FILE).read_text().count("\n") > 1


def test_a_check_before_the_run_does_not_use_the_code_up(tmp_path: Path) -> None:
    """The CLI checks a code before it starts the run; the run checks it again and uses it."""
    verify(SEEDS, "ana", code_at(NOW), tmp_path, consume=False, now=NOW)
    verify(SEEDS, "ana", code_at(NOW), tmp_path, now=NOW)
    with pytest.raises(ApproverError, match="was used"):
        verify(SEEDS, "ana", code_at(NOW), tmp_path, consume=False, now=NOW)
    # the lab's code source hands out the next step's code, never a used one
    later = next_code(SEED, last_step=pyotp.TOTP(SEED).timecode(NOW), now=NOW)
    assert later == code_at(NOW + timedelta(seconds=30))
    assert verify(SEEDS, "ana", str(later), tmp_path, now=NOW)


def test_the_audit_trail_is_append_only_0600_per_store(tmp_path: Path) -> None:
    trail = tmp_path / "audit"
    audit.append(trail, audit.entry("0042", "decommission", "ana", "run-1", "approved", "why"))
    audit.append(trail, audit.entry("0042", "decommission", "ana", "run-1", "done"))
    audit.append(trail, audit.entry("0043", "rollback", "ben", "run-2", "rejected", "sale"))
    path = trail / "store-0042.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(trail.stat().st_mode) == 0o700
    assert [json.loads(line)["decision"] for line in path.read_text().splitlines()] == [
        "approved", "done"]
    assert [r["store"] for r in audit.read(trail)] == ["0042", "0042", "0043"]
    assert set(audit.read(trail, "0043")[0]) == set(audit.FIELDS)
    assert "| 0043 | rollback | ben | run-2 | rejected | sale |" in audit.markdown(
        audit.read(trail, "0043"))
    os.chmod(path, 0o644)  # made readable by others behind its back: refused, not appended
    with pytest.raises(audit.AuditError, match="open to others: chmod 0600"):
        audit.append(trail, audit.entry("0042", "rollback", "ana", "", "done"))
    with pytest.raises(audit.AuditError, match="not a store id"):
        audit.append(trail, audit.entry("../x", "rollback", "ana", "", "done"))


def test_a_run_parameter_may_only_tighten_the_policy() -> None:
    assert tightened("destructive", None) == "destructive"
    assert tightened("destructive", "") == "destructive"
    assert tightened("destructive", "always") == "always"
    assert tightened("never", "destructive") == "destructive"
    with pytest.raises(ValueError, match=r"^approval_policy: 'never' is weaker than the "
                                         r"approval_policy setting 'destructive'; a run may only "
                                         r"tighten it: leave approval_policy empty or use "
                                         r"destructive or always"):
        tightened("destructive", "never")
    with pytest.raises(ValueError, match="'destructive' is weaker than .* 'always'"):
        tightened("always", "destructive")


@pytest.mark.parametrize("flow_name", ["rollout", "batch"])
def test_a_weaker_policy_parameter_fails_the_run_before_any_side_effect(
        flow_name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flows import batch_rollout, rollout

    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0042", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0042}}]')
    touched: list[str] = []
    module: Any = rollout if flow_name == "rollout" else batch_rollout
    monkeypatch.setattr(module, "load_settings", lambda: SimpleNamespace(
        approval_policy="destructive", regions=lambda: touched.append("regions")))
    if flow_name == "rollout":
        monkeypatch.setattr(rollout, "preflight", lambda *a: touched.append("preflight"))
        call = lambda: rollout.store_rollout.fn.__wrapped__(  # noqa: E731
            "0042", str(inventory), approval_policy="never")
    else:
        monkeypatch.setattr(batch_rollout, "get_run_logger", lambda: logging.getLogger("t"))
        call = lambda: batch_rollout.batch_rollout.fn.__wrapped__(  # noqa: E731
            str(inventory), approval_policy="never")
    with pytest.raises(ValueError, match="approval_policy: 'never' is weaker than the "
                                         "approval_policy setting 'destructive'"):
        call()
    assert touched == []


# --- against a real (throwaway) Prefect server: the form on the run's page, the flows -------

@pytest.fixture
def approvers(prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The approvers' Secret Block on the harness server, and the settings that name it."""
    from prefect.blocks.system import Secret

    Secret(value=json.dumps(SEEDS)).save("test-approvers", overwrite=True)
    return settings_with(approvers_block="test-approvers", audit_dir=str(tmp_path / "audit"),
                         approval_policy="destructive", approval_timeout_seconds=60,
                         heartbeat_seconds=30, disruption_seconds=audit_seconds(),
                         default_time_zone="UTC", default_maintenance_windows=["daily 00:00-24:00"])


def audit_seconds() -> dict[str, float]:
    from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS

    return dict(DEFAULT_DISRUPTION_SECONDS)


def always() -> Any:
    from store_rollout.inventory.calendar_spec import CalendarSpec

    return CalendarSpec(time_zone="UTC", windows=["daily 00:00-24:00"])


def answers(*given: tuple[str, dict[str, Any]]) -> Any:
    """Resume the run with each (pause key, answer) in turn, once it is paused under that key."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    def answering(run_id: str) -> None:
        with get_client(sync_client=True) as client:
            for key, answer in given:
                for _ in range(300):
                    state = client.read_flow_run(run_id).state
                    if state is not None and state.is_paused() and \
                            state.state_details.pause_key == key:
                        resume_flow_run(run_id, run_input=answer)
                        break
                    time.sleep(0.2)

    return answering


def test_a_wrong_code_on_the_runs_page_is_refused_and_the_run_asks_again(
        approvers: Any, caplog: pytest.LogCaptureFixture) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    from tasks.approvals import ask_proven

    wrong = f"{(int(pyotp.TOTP(SEED).now()) + 1) % 10**6:06d}"

    @flow
    def asks() -> dict[str, Any]:
        threading.Thread(target=answers(
            ("approval", {"approve": True, "approver": "ana", "code": wrong, "comment": "x"}),
            ("approval-2", {"approve": True, "approver": "ana",
                            "code": pyotp.TOTP(SEED).now(), "comment": "go"}),
        ), args=(flow_run.id,), daemon=True).start()
        answer, name = ask_proven("0042", "recreate_vm", "**Store 0042** waits", 60, approvers)
        return {"approve": answer.approve, "name": name, "id": str(flow_run.id)}

    with caplog.at_level(logging.WARNING):
        result = asks()
    assert (result["approve"], result["name"]) == (True, "ana")
    assert "approval refused: code wrong for 'ana'" in caplog.text
    trail = audit.read(Path(approvers.audit_dir), "0042")
    assert [(r["decision"], r["person"]) for r in trail] == [("refused", ""), ("approved", "ana")]
    assert {r["run_id"] for r in trail} == {result["id"]}


def test_a_decommission_is_approved_by_a_proven_person_and_the_trail_names_them(
        approvers: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A decommission confirmed with --yes: its run checks the approver's code itself (the API
    could start it naming anyone); the trail (file and artifact) names the approver. A wrong
    code fails the run before anything changes."""
    from prefect.client.orchestration import get_client

    from flows import decommission

    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0043", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0043}}]')
    changed: list[str] = []
    monkeypatch.setattr(decommission, "check_region", lambda *_: None)
    monkeypatch.setattr(decommission, "load_settings", lambda: approvers)
    monkeypatch.setattr("store_rollout.settings.load_settings", lambda: approvers)
    for name in ("export_data_disk", "remove_vm", "power_off_hypervisor", "remove_store_keys",
                 "remove_hypervisor_record", "notify_erp_decommissioned", "store_owner"):
        monkeypatch.setattr(decommission, name, lambda *a, _n=name, **k: changed.append(_n)
                            or {"erp_id": "E1", "replay": False})
    monkeypatch.setattr(decommission, "tags", lambda *a: __import__("contextlib").nullcontext())
    monkeypatch.setattr(decommission, "store_owner",
                        lambda *a: __import__("contextlib").nullcontext())
    wrong = f"{(int(pyotp.TOTP(SEED).now()) + 1) % 10**6:06d}"
    state = decommission.store_decommission("0043", str(inventory), approver="ana", code=wrong,
                                            return_state=True)
    assert state.is_failed() and "code wrong for 'ana'" in str(state.message), state.message
    assert changed == []
    state = decommission.store_decommission("0043", str(inventory), approver="ana",
                                            code=pyotp.TOTP(SEED).now(), return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["authorization"]["approver"] == "ana"
    trail = audit.read(Path(approvers.audit_dir), "0043")
    assert [(r["action"], r["person"], r["decision"]) for r in trail] == [
        ("decommission", "ana", "approved"), ("decommission", "ana", "done")], trail
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        shown = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["audit-0043"])))
    assert any("| 0043 | decommission | ana |" in str(a.data) for a in shown), shown


def test_a_yes_without_a_proven_approver_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    """`--yes` alone no longer approves a destructive command: under the approval policy
    destructive it needs --approver and --code; one line, exit 2, before any run starts."""
    import yaml
    from typer.testing import CliRunner

    from app.cli import app

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"stores": [{
        "store_id": "0001", "erp": {"site_code": "S1"},
        "hypervisor": {"hostname": "hv1.example", "mac": "52:54:00:00:00:01"}}]}))
    env = {"STORE_ROLLOUT_SETTINGS_FILE": "", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/dev/null",
           "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "127.0.0.1",
           "STORE_ROLLOUT_COBBLER_URL": "https://c.invalid/", "STORE_ROLLOUT_COBBLER_USER": "u",
           "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "cobbler-password",
           "STORE_ROLLOUT_ERP_URL": "https://e.invalid", "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "erp-token",
           "STORE_ROLLOUT_IMAGE_BASE_URL": "https://i.invalid",
           "STORE_ROLLOUT_AUDIT_DIR": str(tmp_path / "audit")}
    for command in ("rollback", "decommission"):
        result = CliRunner().invoke(app, [command, "0001", "--inventory", str(path), "--yes"],
                                    env=env)
        text = " ".join(result.output.split())
        assert result.exit_code == 2, text
        assert (f"{command} of store 0001: --yes needs --approver NAME and --code CODE"
                in text), text
        result = CliRunner().invoke(app, [command, "0001", "--inventory", str(path), "--yes",
                                          "--code", "123456"], env=env)
        assert "--approver: name the approver" in " ".join(result.output.split())
    assert not (tmp_path / "audit").exists()  # nothing recorded: nothing started
