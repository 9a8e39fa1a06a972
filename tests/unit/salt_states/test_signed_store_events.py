"""Issue 44: a hypervisor's libvirt events reach Prefect on its key's word, not on the `id` an
event claims.

A minion's batch event is fired on the master's bus as the minion wrote it, `id` included, so any
accepted minion could claim to be store 0042's hypervisor. The hypervisor's store_libvirt_events
engine signs each event (tag, claimed id, body, time) with its own minion key (Signer, through
salt.crypt.sign_message); the master's store_prefect_events forwards it only when the accepted
public key of the claimed id verifies it (SignedEvents). Real RSA key pairs, the master's pki
layout in tmp_path, the event body through Salt's own msgpack serialisation as it crosses the
wire; the signature made by Salt 3006.0 under Python 3.6 is verified in
tests/unit/salt_states/test_host_python36.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from store_rollout.contracts import LIBVIRT_EVENT_TAG_PREFIX, STORE_EVENT_SIGNATURE
from tests.helpers import load_salt_module

HV, OTHER_HV = "store-0042-hv", "store-0043-hv"
TAG = f"{LIBVIRT_EVENT_TAG_PREFIX}/xen/system/domain/lifecycle"
LIFECYCLE = {"uri": "xen:///system", "event": "stopped", "detail": "destroyed",
             "domain": {"name": "store-0042-vm", "id": 7, "uuid": "u-42"}}


def key_pair(pki: Path) -> Path:
    """A minion's key pair as Salt writes it: minion.pem and minion.pub in its pki_dir."""
    pki.mkdir(parents=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "minion.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()))
    (pki / "minion.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


@pytest.fixture
def master_opts(tmp_path: Path) -> dict[str, Any]:
    """The master's pki with both hypervisors' keys accepted."""
    pki = tmp_path / "master" / "pki"
    (pki / "minions").mkdir(parents=True)
    for minion in (HV, OTHER_HV):
        own = key_pair(tmp_path / minion / "pki")
        (pki / "minions" / minion).write_bytes((own / "minion.pub").read_bytes())
    return {"pki_dir": str(pki)}


@pytest.fixture(scope="module")
def engine() -> Any:
    return load_salt_module("_engines", "store_libvirt_events")


@pytest.fixture(scope="module")
def forwarder() -> Any:
    return load_salt_module("_engines", "store_prefect_events")


def sent_by(engine: Any, tmp_path: Path, key_of: str, claims: str, data: dict[str, Any],
            tag: str = TAG, clock: Any = time.time) -> dict[str, Any]:
    """The event as the master's bus has it: signed with `key_of`'s own key by the engine's
    Signer on that host, `id` set to what its sender `claims`, through Salt's msgpack."""
    import salt.payload

    sent: list[tuple[str, dict[str, Any]]] = []
    signer = engine.Signer({"event.send": lambda t, d: sent.append((t, d))}, claims,
                           str(tmp_path / key_of / "pki" / "minion.pem"), clock=clock)
    signer["event.send"](tag, data)
    [(sent_tag, body)] = sent
    assert sent_tag == tag
    return dict(salt.payload.loads(salt.payload.dumps(
        {"id": claims, "tag": tag, "cmd": "_minion_event", "data": body})))


def test_a_signed_event_of_the_stores_own_hypervisor_is_forwarded(
        engine: Any, forwarder: Any, master_opts: dict[str, Any], tmp_path: Path) -> None:
    data = sent_by(engine, tmp_path, HV, HV, LIFECYCLE)
    assert set(data["data"][STORE_EVENT_SIGNATURE]) == {"time", "value"}
    event = forwarder._libvirt_event(forwarder.SignedEvents(master_opts), TAG, data)
    assert event is not None and event["event"] == "salt.store.libvirt.domain.stopped"
    assert event["payload"]["hypervisor"] == HV and event["resource"]["store.id"] == "0042"
    assert STORE_EVENT_SIGNATURE not in event["payload"]


def test_another_stores_minion_claiming_the_hypervisor_is_dropped(
        engine: Any, forwarder: Any, master_opts: dict[str, Any], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Store 0043's hypervisor, compromised, fires a batch event claiming to be 0042's."""
    forged = sent_by(engine, tmp_path, OTHER_HV, HV, LIFECYCLE)
    with caplog.at_level(logging.WARNING):
        assert forwarder._libvirt_event(forwarder.SignedEvents(master_opts), TAG, forged) is None
    assert any(repr(HV) in r.getMessage() and "not that minion's" in r.getMessage()
               for r in caplog.records), caplog.text


@pytest.mark.parametrize("change", ["unsigned", "body", "tag", "id", "no key", "stale",
                                    "garbage"])
def test_an_event_the_claimed_key_did_not_sign_just_now_is_dropped(
        engine: Any, forwarder: Any, master_opts: dict[str, Any], tmp_path: Path,
        change: str, caplog: pytest.LogCaptureFixture) -> None:
    signed = forwarder.SignedEvents(master_opts)
    tag = TAG
    if change == "stale":
        data = sent_by(engine, tmp_path, HV, HV, LIFECYCLE, clock=lambda: time.time() - 301)
    else:
        data = sent_by(engine, tmp_path, HV, HV, LIFECYCLE)
    body = data["data"]
    if change == "unsigned":
        del body[STORE_EVENT_SIGNATURE]
    elif change == "body":
        body["domain"] = {**body["domain"], "name": "store-0042-vm", "uuid": "other"}
    elif change == "tag":
        tag = TAG.replace("domain/lifecycle", "connection/lost")
    elif change == "id":  # the signature of 0042's host, replayed as 0043's
        data["id"] = OTHER_HV
    elif change == "no key":
        (Path(master_opts["pki_dir"]) / "minions" / HV).unlink()
    elif change == "garbage":
        body[STORE_EVENT_SIGNATURE] = {"time": int(time.time()), "value": "%%not base64"}
    with caplog.at_level(logging.WARNING):
        assert forwarder._libvirt_event(signed, tag, data) is None
    assert f"claiming minion {data['id']!r}" in caplog.text, caplog.text


def test_a_replayed_event_is_forwarded_once(
        engine: Any, forwarder: Any, master_opts: dict[str, Any], tmp_path: Path) -> None:
    signed = forwarder.SignedEvents(master_opts)
    data = sent_by(engine, tmp_path, HV, HV, LIFECYCLE)
    assert forwarder._libvirt_event(signed, TAG, data) is not None
    assert forwarder._libvirt_event(signed, TAG, data) is None


def test_a_host_without_its_key_sends_unsigned_and_says_so(
        engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    signer = engine.Signer({"event.send": lambda t, d: sent.append((t, d))}, HV,
                           str(tmp_path / "missing" / "minion.pem"))
    with caplog.at_level(logging.WARNING):
        signer["event.send"](TAG, LIFECYCLE)
        signer["event.send"](TAG, LIFECYCLE)
    assert [d for _, d in sent] == [LIFECYCLE, LIFECYCLE]
    assert caplog.text.count("cannot sign") == 1, caplog.text
