"""Issue 44: no secret in clear on a wire or in a file, and what Cobbler keeps of an install
(unit tests; the real Cobbler's side is tests/test_lab_cobbler.py, a rollout's
tests/test_rollout_e2e.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from store_rollout.contracts import MASTER_FINGER_META, MASTER_HASH_TYPE_META
from tasks.salt import SaltError
from tasks.salt.master_key import master_pin


def _write_master_pub(pki: Path) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "master.pub").write_bytes(pem)
    return pem


@pytest.mark.parametrize("hash_type", ["sha256", "sha512"])
def test_master_pin_is_salt_key_f_master_in_the_masters_hash_type(tmp_path: Path,
                                                                  hash_type: str) -> None:
    pem = _write_master_pub(tmp_path / "pki")
    # what `salt-key -F master` prints: the hash of the PEM body (no BEGIN/END lines), the hex
    # digits in colon-separated pairs
    body = b"".join(pem.splitlines(keepends=True)[1:-1])
    digest = hashlib.new(hash_type, body).hexdigest()
    expected = ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
    pin = master_pin({"pki_dir": str(tmp_path / "pki"), "hash_type": hash_type})
    assert pin == {MASTER_FINGER_META: expected, MASTER_HASH_TYPE_META: hash_type}


def test_no_master_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SaltError, match=r"public key .*master\.pub is missing: start the master"):
        master_pin({"pki_dir": str(tmp_path)})
