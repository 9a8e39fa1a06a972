"""Issue 27, item 6: a one-time autosign token signs in its own minion id only, once.

The token travels in the AutoYaST profile, which Cobbler serves to anyone on the store network
for the whole install. The master's store_autosign_guard engine revokes a token the moment its
own id is accepted, and removes a key another id got with it; step 3 fails when two keys claim
the hypervisor's id. The lab test plays the intruder: it reads the token from the profile Cobbler
serves, over the store network, and signs in with it, first as a made-up id, then as the
hypervisor itself before the real host.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from lab.autoyast import parse_autoyast
from lab.prefect_access import api_session
from lab.simulator.firmware import _FETCH
from lab.simulator.minions import MinionManager
from lab.state import VENV_BIN, LabInfo, LabPaths
from lab.store_network import StoreNetwork
from store_rollout.contracts import AUTOSIGN_GRAIN, AUTOSIGN_REFUSED_TAG, TOKEN_MAP_FILE
from tasks.salt import SaltMasterClient
from tests.helpers import (
    bmc_power,
    load_salt_module,
    start_rollout,
    wait_for,
    write_inventory,
)


def master_config(tmp_path: Path) -> Path:
    root = tmp_path / "master"
    (root / "autosign_grains").mkdir(parents=True)
    config = tmp_path / "master.conf"
    config.write_text(yaml.safe_dump({"root_dir": str(root), "user": "root",
                                      "autosign_grains_dir": str(root / "autosign_grains"),
                                      "pki_dir": str(root / "pki"), "cachedir": str(root / "c"),
                                      "sock_dir": str(root / "s")}))
    return config


def test_the_guard_revokes_a_token_at_its_own_id_and_names_a_foreign_one(tmp_path: Path) -> None:
    """The files the pipeline writes (SaltMasterClient.issue_token), as the guard judges them."""
    client = SaltMasterClient(master_config(tmp_path))
    hv, vm = client.issue_token("store-0001-hv"), client.issue_token("store-0001-vm")
    guard = load_salt_module("_engines", "store_autosign_guard")
    opts = client.opts

    assert guard.judge(opts, "intruder", vm) == ("foreign", "store-0001-vm")
    assert client.autosign_tokens() == [hv, vm]  # still there for the VM itself
    assert guard.judge(opts, "store-0001-hv", hv) == ("revoked", "store-0001-hv")
    assert client.autosign_tokens() == [vm] and client.token_for("store-0001-hv") is None
    assert json.loads((Path(opts["autosign_grains_dir"]).parent / TOKEN_MAP_FILE).read_text()) \
        == {"store-0001-vm": vm}
    assert guard.judge(opts, "store-0001-hv", hv) == (None, None)  # revoked: a re-auth
    assert guard.judge(opts, "store-0001-vm", vm) == ("revoked", "store-0001-vm")
    assert client.autosign_tokens() == []


def test_preflight_refuses_a_master_that_does_not_guard_its_tokens() -> None:
    from tasks.preflight import autosign_guard_problem

    guarded = {"engines": ["store_autosign_guard", {"store_prefect_events": {"api_url": "x"}}],
               "auth_events_autosign_grains": ["accept"], "auth_events": True}
    assert autosign_guard_problem(guarded) is None
    problem = autosign_guard_problem({"engines": [{"store_prefect_events": {}}],
                                      "auth_events": True})
    assert problem and "engines: [store_autosign_guard]" in problem, problem
    assert "auth_events_autosign_grains: [accept]" in problem, problem
    assert "auth_events: True" in str(autosign_guard_problem({**guarded, "auth_events": False}))


def served_profile(lab: LabInfo, system: str) -> str | None:
    """The profile as anyone on the store network gets it: no login."""
    network = StoreNetwork.load(Path(lab.store_network_state))
    port = int(lab.cobbler_http_url.rsplit(":", 1)[1].split("/")[0])
    url = f"{network.url(port)}/cblr/svc/op/autoinstall/system/{system}"
    done = network.run([sys.executable, "-c", _FETCH, url], capture_output=True, text=True,
                       timeout=60, check=False)
    return done.stdout if done.returncode == 0 and "<profile" in done.stdout else None


def step_running(lab: LabInfo, task_run_name: str) -> bool:
    runs = api_session(lab).post(f"{lab.prefect_api_url}/task_runs/filter", json={
        "task_runs": {"name": {"any_": [task_run_name]}}}, timeout=10).json()
    return any(r["state_type"] == "RUNNING" for r in runs)


def intruder_config(profile: str, minion_id: str) -> dict[str, str]:
    """The profile's minion config, as the intruder takes it: the token grain, another id, no
    startup highstate."""
    conf = parse_autoyast(profile).files["/etc/salt/minion.d/50-store-rollout.conf"]
    conf = re.sub(r"(?m)^id: .*$", f"id: '{minion_id}'", conf)
    conf = re.sub(r"(?m)^startup_states: .*$", "", conf)
    return {"50-store-rollout.conf": conf}


def fingerprint(manager: MinionManager, minion_id: str) -> str:
    """As the master's key.finger has it: of the public key as the minion sent it."""
    import salt.crypt
    import salt.utils.crypt

    pub = salt.crypt.clean_key((manager.root_dir(minion_id) / "pki" / "minion.pub").read_text())
    return str(salt.utils.crypt.pem_finger(key=pub, sum_type="sha256"))


@pytest.mark.lab
def test_an_intruder_with_the_profiles_token_gets_no_key_and_no_store(
        lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    # ids and MAC of this run: a lab keeps its stores, keys and Cobbler records
    run = secrets.token_hex(2)
    store, hv, vm = f"f-intr{run}", f"store-f-intr{run}-hv", f"store-f-intr{run}-vm"
    made_up = f"intruder-{run}"
    inv = write_inventory(tmp_path / "inv.yaml", [store], f"52:54:00:fe:{run[:2]}", lab=lab)
    master = SaltMasterClient(lab.salt_master_config)
    manager = MinionManager(LabPaths(Path(lab.state_dir)), lab)
    faults = f"{lab.simulator_url}/faults/pxe"
    # the real host installs late: the intruder has the install window to itself
    requests.post(faults, json={"delay": 30}, timeout=5).raise_for_status()
    proc = start_rollout(lab_env, store, inv)
    try:
        # the host is powered on and installing: step 3 waits for it
        wait_for(lambda: step_running(lab, f"wait_for_hypervisor-{store}"), timeout=120,
                 interval=0.5, what=f"step 3 of {store} running")
        profile = served_profile(lab, hv)
        assert profile, f"Cobbler serves no profile for {hv}"
        token = re.search(rf"{AUTOSIGN_GRAIN}: '([0-9a-f]+)'", profile)
        assert token, profile
        # 1. the token with a made-up id: the key is removed again at once, the event says so
        with master.subscribe(AUTOSIGN_REFUSED_TAG) as bus:
            manager.install(made_up, intruder_config(profile, made_up), {}, salt_bin=VENV_BIN)
            manager.start(made_up, "intruder with a made-up id")
            refused = master.wait_for_event(bus, lambda e: e.tag == AUTOSIGN_REFUSED_TAG,
                                            timeout=60, what=AUTOSIGN_REFUSED_TAG)
        assert refused.data["id"] == made_up and refused.data["token_of"] == hv, refused.data
        assert refused.data["fingerprint"] == fingerprint(manager, made_up)
        manager.stop(made_up, "intruder done")
        assert master.key_state(made_up) in (None, "pending"), master.key_state(made_up)
        assert master.token_for(hv) == token.group(1)  # still the real host's
        # 2. the token with the hypervisor's own id, before the real host
        manager.install(hv, intruder_config(profile, hv), {}, salt_bin=VENV_BIN)
        manager.start(hv, "intruder as the hypervisor")
        wait_for(lambda: master.key_state(hv) == "accepted", timeout=60,
                 what=f"the intruder accepted as {hv}")
        intruder_fp = fingerprint(manager, hv)
        # the token is spent the moment the key is accepted
        assert master.token_for(hv) is None and token.group(1) not in master.autosign_tokens()
        out, err = proc.communicate(timeout=300)
    finally:
        requests.delete(faults, timeout=5)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    error = str(json.loads(out).get("error") or "") + err
    said = re.search(rf"two keys claim hypervisor minion {hv}: accepted (\S+), "
                     r"denied (\S+)\.", error)
    assert said, error[-3000:]
    assert said.group(1) == intruder_fp and said.group(2) != intruder_fp
    # both keys removed; the real host signs in again, without a token now: pending at most
    assert master.key_state(hv) in (None, "pending")
    # nothing of the store went on: no VM token, no VM key, no domain
    assert master.token_for(vm) is None and master.key_state(vm) is None
    import libvirt

    conn = libvirt.open(lab.libvirt_uri)
    try:
        assert vm not in [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()
    # the rollout's own log named the first attempt
    api = lab.prefect_api_url
    run = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{store}"]}}}, timeout=10).json()[0]
    logs: list[dict[str, Any]] = api_session(api).post(f"{api}/logs/filter", json={
        "logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}, timeout=10).json()
    assert any(made_up in entry["message"] and "autosign guard" in entry["message"]
               for entry in logs), "\n".join(entry["message"] for entry in logs)
    # the lab's own host for the store: powered off, so it stops signing in
    bmc_power(lab, hv, "off")
    manager.stop(hv, "intruder done")
    for minion in (made_up, hv):  # whatever the machines left pending
        master.delete_key(minion)
