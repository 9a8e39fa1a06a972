"""Issue 5: secrets stay secret, autosign is scoped and one-time, keys are deleted by exact id."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.blocks.system import Secret
from pydantic import SecretStr

from lab.prefect_access import PrefectAccess, api_session
from lab.state import REGISTRATION_CODE_BLOCK, VENV_BIN, LabInfo
from tasks.bmc import BmcCredentials
from tasks.cobbler import CobblerAuthError, CobblerClient
from tasks.salt import SaltMasterClient
from tests.helpers import check_store, write_inventory


def test_default_cobbler_credentials_refused_outside_the_lab() -> None:
    with pytest.raises(CobblerAuthError, match="default credentials"):
        CobblerClient(url="https://cobbler.invalid/cobbler_api", user="cobbler", password="cobbler")
    # an explicit opt-in exists for a throwaway Cobbler, never the default
    CobblerClient(url="https://cobbler.invalid/", user="cobbler", password="cobbler",
                  allow_default_credentials=True)


@pytest.mark.lab
def test_autosign_token_refuses_globs_and_is_one_time(lab: LabInfo) -> None:
    master = SaltMasterClient(lab.salt_master_config)
    with pytest.raises(ValueError):
        master.issue_token("store-*")
    token = master.issue_token("sec-token-vm")
    assert master.issue_token("sec-token-vm") == token  # idempotent until revoked
    assert token in master.autosign_tokens() and "*" not in master.autosign_tokens()
    assert master.revoke_token("sec-token-vm")
    assert token not in master.autosign_tokens() and master.token_for("sec-token-vm") is None


@pytest.mark.lab
def test_key_deletion_is_exact(lab: LabInfo) -> None:
    master = SaltMasterClient(lab.salt_master_config)
    for mid in ("sec-key-vm", "sec-key-vm2", "sec-key-vmx"):
        master._wheel("key.gen_accept", id_=mid)
    try:
        assert master.delete_key("sec-key-vm")
        keys = master.list_keys()["minions"]
        assert "sec-key-vm" not in keys
        assert "sec-key-vm2" in keys and "sec-key-vmx" in keys
        with pytest.raises(ValueError):
            master.delete_key("sec-key-*")
    finally:
        for mid in ("sec-key-vm2", "sec-key-vmx"):
            master.delete_key(mid)


@contextlib.contextmanager
def lab_prefect_settings(lab_env: dict[str, str]) -> Iterator[None]:
    """Prefect settings of this process pointed at the lab's server, as `lab_env` points the
    subprocesses (TLS with the lab CA, logged in)."""
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_SSL_CERT_FILE,
        PREFECT_API_URL,
        PREFECT_HOME,
        temporary_settings,
    )

    with temporary_settings(updates={
            PREFECT_API_URL: lab_env["PREFECT_API_URL"], PREFECT_HOME: lab_env["PREFECT_HOME"],
            PREFECT_API_AUTH_STRING: lab_env["PREFECT_API_AUTH_STRING"],
            PREFECT_API_SSL_CERT_FILE: lab_env["PREFECT_API_SSL_CERT_FILE"]}):
        yield


@pytest.mark.lab
def test_canary_secret_never_reaches_logs_artifacts_events_or_json(
        lab: LabInfo, lab_dir: Path, lab_env: dict[str, str], tmp_path: Path) -> None:
    canary = f"CANARY-{uuid.uuid4().hex}"
    block = f"canary-erp-token-{uuid.uuid4().hex[:6]}"
    # the ERP token comes from a Prefect Secret block; the lab ERP accepts it
    bmc_block = f"canary-bmc-{uuid.uuid4().hex[:6]}"
    with lab_prefect_settings(lab_env):  # blocks are set up, not tested: no 4-s Python start
        secret: Any = Secret(value=canary)
        secret.save(block, overwrite=True)
        # the BMC login in a BMC Credentials Block of its own; the BMCs refuse any other
        BmcCredentials(username=lab.bmc_user,
                       password=SecretStr(lab.bmc_password)).save(bmc_block, overwrite=True)
    with open(lab_dir / "erp" / "token", "a") as tokens:
        tokens.write(f"\n{canary}\n")
    inv = write_inventory(tmp_path / "inv.yaml", ["sec-canary"], "52:54:00:5e:00", lab=lab)
    env = {**lab_env, "STORE_ROLLOUT_ERP_TOKEN_BLOCK": block,
           "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": bmc_block}
    proc = subprocess.run([str(VENV_BIN / "store-rollout"), "rollout", "sec-canary",
                           "--inventory", str(inv), "--json"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    check_store(lab, "sec-canary", result)
    notices = [json.loads(line) for line in Path(lab.erp_log).read_text().splitlines()]
    mine = [n for n in notices if (n.get("payload") or {}).get("store_id") == "sec-canary"]
    assert mine and all(n["authorized"] for n in mine)  # the canary really was the credential

    # the store's root password, made by step 2 in its Secret block, and the hash of it
    with lab_prefect_settings(lab_env):
        block: Any = Secret.load("store-sec-canary-root-password")
        root_password = block.value.get_secret_value()
        # the chain's SLES registration code (issue 46): step 2 put it in the store's record
        code_block: Any = Secret.load(REGISTRATION_CODE_BLOCK)
        registration_code = code_block.get()
    assert len(root_password) == 20, "no root password block for the store"
    assert len(registration_code) == 16, "no registration code block in the lab"
    secrets = [canary, lab.cobbler_password, lab.bmc_password, root_password, registration_code,
               PrefectAccess.of(lab).auth_string.split(":", 1)[1]]  # the API's credential
    api = lab.prefect_api_url
    run = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": ["rollout-sec-canary"]}}}, timeout=10).json()[0]
    logs = api_session(api).post(f"{api}/logs/filter", json={
        "logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}, timeout=10).text
    artifacts = api_session(api).post(f"{api}/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"]]}}}, timeout=10).text
    events = api_session(api).post(f"{api}/events/filter", json={
        "filter": {"any_resource": {"id_prefix": [f"prefect.flow-run.{run['id']}"]}},
        "limit": 50}, timeout=10).text
    assert "rollout-sec-canary" in artifacts or "sec-canary" in artifacts
    for secret in secrets:
        for where, text in (("--json output", proc.stdout), ("CLI log", proc.stderr),
                            ("Prefect logs", logs), ("artifacts", artifacts), ("events", events),
                            ("flow run parameters", json.dumps(run))):
            assert secret not in text, f"a secret leaked into {where}"
    # Cobbler holds no BMC login: not in the store's record (get_system hands power_pass to
    # any caller), not in any log Cobbler wrote (its power manager logged the fence agent's
    # input, password included); nor do the BMC emulators log it
    record = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                           password=lab.cobbler_password).get_system("store-sec-canary-hv")
    assert record is not None and lab.bmc_password not in json.dumps(record)
    # step 4 cleared the registration code with the token and root's hash, once the host was ready
    assert registration_code not in json.dumps(record)
    assert not record.get("power_pass") and not record.get("power_user")
    logs_written = [path for root in (Path(lab.state_dir) / "cobbler",)
                    for path in root.rglob("*") if path.is_file() and "log" in str(path)]
    logs_written += list((Path(lab.state_dir) / "logs").glob("*bmc*.log"))
    assert any("cobbler" in str(p) for p in logs_written) and len(logs_written) > 3
    for path in logs_written:
        text = path.read_text(errors="replace")
        assert lab.bmc_password not in text, f"BMC password in {path}"
        assert registration_code not in text, f"registration code in {path}"
