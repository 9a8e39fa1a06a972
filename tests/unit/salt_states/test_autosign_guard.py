"""Issue 44, item 3: the autosign guard acts on the master's key files, not on an event's word.

Any accepted minion can put a `salt/auth` of its own making on the master's bus (a batch event:
Salt's minion event blacklist does not cover `salt/auth`), naming another store's id and an
outstanding token. The guard revokes or deletes only when `<pki_dir>/minions/<id>` holds the
event's public key and was written just now. Real token files (SaltMasterClient.issue_token),
real key files and key pairs, Salt's own key deletion; the bus is a recorder of what the guard
fires.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from store_rollout.contracts import AUTOSIGN_FORGED_TAG, AUTOSIGN_GRAIN, AUTOSIGN_REFUSED_TAG
from tasks.salt import SaltMasterClient
from tests.helpers import load_salt_module
from tests.unit.salt_states.test_autosign_intruder import master_config

VICTIM = "store-0001-hv"
VICTIM_VM = "store-0001-vm"


class Bus:
    """What the guard fires on the master's bus."""

    def __init__(self) -> None:
        self.fired: list[tuple[str, dict[str, Any]]] = []

    def fire_event(self, data: dict[str, Any], tag: str) -> bool:
        self.fired.append((tag, data))
        return True


def public_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def accepted(opts: dict[str, Any], minion_id: str, pub: str, age: float = 0.0) -> Path:
    """The key file the master writes when it accepts `minion_id`, `age` seconds ago."""
    path = Path(opts["pki_dir"]) / "minions" / minion_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pub)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def auth_event(minion_id: str, pub: str, token: str) -> dict[str, Any]:
    """A `salt/auth` accept event's data as the master fires it (auth_events_autosign_grains)."""
    return {"result": True, "act": "accept", "id": minion_id, "pub": pub,
            "autosign_grains": {AUTOSIGN_GRAIN: token}}


@pytest.fixture
def master(tmp_path: Path) -> SaltMasterClient:
    client = SaltMasterClient(master_config(tmp_path))
    os.makedirs(client.opts["cachedir"])  # a running master's (a deletion marks its AES rotation)
    return client


def test_a_forged_auth_for_a_key_accepted_long_ago_deletes_nothing(
        master: SaltMasterClient, caplog: pytest.LogCaptureFixture) -> None:
    """An intruder names a live store's id, its real public key and another store's token."""
    guard, bus = load_salt_module("_engines", "store_autosign_guard"), Bus()
    vm_token = master.issue_token(VICTIM_VM)
    pub = public_pem()
    key = accepted(master.opts, VICTIM, pub, age=3600)
    with caplog.at_level(logging.WARNING):
        assert guard.handle(master.opts, bus, auth_event(VICTIM, pub, vm_token)) == "forged"
    assert key.read_text() == pub
    assert master.token_for(VICTIM_VM) == vm_token  # still the VM's, for its own sign-in
    assert [tag for tag, _ in bus.fired] == [AUTOSIGN_FORGED_TAG], bus.fired
    assert bus.fired[0][1]["id"] == VICTIM and bus.fired[0][1]["token_of"] == VICTIM_VM
    assert any("forged salt/auth" in r.getMessage() and repr(VICTIM) in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_forged_auth_with_another_public_key_deletes_nothing(master: SaltMasterClient) -> None:
    guard, bus = load_salt_module("_engines", "store_autosign_guard"), Bus()
    vm_token = master.issue_token(VICTIM_VM)
    key = accepted(master.opts, VICTIM, public_pem())  # just accepted, but not this key
    assert guard.handle(master.opts, bus, auth_event(VICTIM, public_pem(), vm_token)) == "forged"
    assert key.exists()
    assert "not the accepted key" in bus.fired[0][1]["reason"]


@pytest.mark.parametrize("claimed", [VICTIM_VM, "../minions_pre/" + VICTIM, ["x"]])
def test_a_forged_auth_revokes_no_token_of_a_key_never_accepted(
        master: SaltMasterClient, claimed: Any) -> None:
    """Its own token with its own id, before the VM signs in: the token would be spent."""
    guard, bus = load_salt_module("_engines", "store_autosign_guard"), Bus()
    vm_token = master.issue_token(VICTIM_VM)
    assert guard.handle(master.opts, bus, auth_event(claimed, public_pem(), vm_token)) == "forged"
    assert master.token_for(VICTIM_VM) == vm_token and vm_token in master.autosign_tokens()


def test_a_fresh_accept_with_a_foreign_token_is_deleted(master: SaltMasterClient) -> None:
    """What the master really fires when an intruder signs in with the VM's token."""
    guard, bus = load_salt_module("_engines", "store_autosign_guard"), Bus()
    vm_token = master.issue_token(VICTIM_VM)
    pub = public_pem()
    # the master writes the PEM as the minion sent it; the event may differ in line ends
    key = accepted(master.opts, "intruder", pub)
    assert guard.handle(master.opts, bus, auth_event("intruder", pub.replace("\n", "\r\n"),
                                                     vm_token)) == "foreign"
    assert not key.exists()
    assert [(tag, data["id"], data["token_of"]) for tag, data in bus.fired] \
        == [(AUTOSIGN_REFUSED_TAG, "intruder", VICTIM_VM)]
    assert master.token_for(VICTIM_VM) == vm_token


def test_a_fresh_accept_of_its_own_id_revokes_the_token(master: SaltMasterClient) -> None:
    guard, bus = load_salt_module("_engines", "store_autosign_guard"), Bus()
    token = master.issue_token(VICTIM)
    pub = public_pem()
    key = accepted(master.opts, VICTIM, pub, age=2)
    assert guard.handle(master.opts, bus, auth_event(VICTIM, pub, token)) == "revoked"
    assert key.exists() and master.token_for(VICTIM) is None and bus.fired == []
    # its later re-auths carry the spent token: nothing to judge, nothing said
    assert guard.handle(master.opts, bus, auth_event(VICTIM, pub, token)) is None
    assert bus.fired == []
