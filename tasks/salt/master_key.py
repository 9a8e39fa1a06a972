"""The master's own public key as a store host pins it: the minion config's `master_finger`
(the minion refuses a master whose key has another fingerprint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store_rollout.contracts import MASTER_FINGER_META, MASTER_HASH_TYPE_META
from tasks.salt.errors import SaltError


def master_pin(opts: dict[str, Any]) -> dict[str, str]:
    """What `salt-key -F master` prints for the master's `pki_dir/master.pub` (Salt's
    pem_finger in the master's hash_type), and that hash_type: the minion computes the
    fingerprint in its own hash_type, so the profile gives it the master's."""
    import salt.utils.crypt

    path = Path(str(opts.get("pki_dir") or "")) / "master.pub"
    hash_type = str(opts.get("hash_type") or "sha256")
    try:
        finger = salt.utils.crypt.pem_finger(path=str(path), sum_type=hash_type)
    except OSError as exc:
        raise SaltError(f"the Salt master's public key {path} cannot be read ({exc.strerror}): "
                        "start the master once (it makes its key pair) and run the worker as "
                        "the master's user or root", operation="master_finger") from None
    if not finger:  # pem_finger answers "" for a file that is not there
        raise SaltError(f"the Salt master's public key {path} is missing: start the master "
                        "once (it makes its key pair), or fix pki_dir in its config",
                        operation="master_finger")
    return {MASTER_FINGER_META: str(finger), MASTER_HASH_TYPE_META: hash_type}
