"""A store VM's backup secrets: the orchestrator (store_rollout/backup_secrets.py) and the
master's ext_pillar (salt_states/_pillar/store_backup.py, its own copy of the derivation) derive
the same, and the pillar gives them to that VM only."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest

from store_rollout.backup_secrets import (
    REPOSITORY_PASSWORD,
    REST_PASSWORD,
    derive,
    is_store_vm,
    repository_url,
)
from tests.helpers import load_salt_module

URL = "https://10.0.0.9:8443"


@pytest.fixture
def pillar_module():  # noqa: ANN201 - a module loaded from a file
    return load_salt_module("_pillar", "store_backup")


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "store-backup.key"
    path.write_text("k3y-of-the-region\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("key", ["k", "k3y-of-the-region", "é" * 40])
@pytest.mark.parametrize("minion", ["store-0001-vm", "store-a-b-vm"])
@pytest.mark.parametrize("purpose", [REST_PASSWORD, REPOSITORY_PASSWORD])
def test_both_sides_derive_the_same(pillar_module, key: str, minion: str, purpose: str) -> None:
    ours = derive(key, minion, purpose)
    assert ours == pillar_module.derive(key, minion, purpose)
    assert ours == hmac.new(key.encode(), f"{purpose}:{minion}".encode(),
                            hashlib.sha256).hexdigest()
    assert ours != derive(key, minion.replace("0", "9").replace("a", "z"), purpose)
    other = REPOSITORY_PASSWORD if purpose == REST_PASSWORD else REST_PASSWORD
    assert ours != derive(key, minion, other)


def test_the_pillar_of_a_store_vm_holds_its_own_secrets(pillar_module, key_file: Path,
                                                        tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    got = pillar_module.ext_pillar("store-0001-vm", {}, key_file=str(key_file), url=URL,
                                   ca_file=str(ca))["store_backup"]
    key = "k3y-of-the-region"
    assert got == {"url": URL, "user": "store-0001-vm", "ca_pem": ca.read_text(),
                   "rest_password": derive(key, "store-0001-vm", REST_PASSWORD),
                   "repository_password": derive(key, "store-0001-vm", REPOSITORY_PASSWORD)}


@pytest.mark.parametrize("minion", ["store-0001-hv", "store-0001-hv-a1b2c3", "lab-master",
                                    "store-0001-vm-x", "xstore-0001-vm", "store--vm"])
def test_no_pillar_for_anything_but_a_store_vm(pillar_module, key_file: Path,
                                               minion: str) -> None:
    assert pillar_module.ext_pillar(minion, {}, key_file=str(key_file), url=URL) == {}
    assert not is_store_vm(minion)


def test_no_pillar_from_a_key_file_others_may_read_or_a_missing_one(pillar_module,
                                                                   key_file: Path) -> None:
    os.chmod(key_file, 0o644)
    assert pillar_module.ext_pillar("store-0001-vm", {}, key_file=str(key_file), url=URL) == {}
    assert pillar_module.ext_pillar("store-0001-vm", {}, key_file=str(key_file) + ".gone",
                                    url=URL) == {}
    assert pillar_module.ext_pillar("store-0001-vm", {}, key_file="", url=URL) == {}


def test_the_repository_url_carries_the_login_and_names_the_vm() -> None:
    assert repository_url(URL + "/", "store-0001-vm", "p@ss", "store-0001-vm") == (
        "rest:https://store-0001-vm:p%40ss@10.0.0.9:8443/store-0001-vm/")
    with pytest.raises(ValueError, match="expected https://host:port"):
        repository_url("http://10.0.0.9:8000", "u", "p", "store-0001-vm")
