"""A store host's root password: kept in the store's Prefect Secret block (made on its first
install, reused by every rerun and reinstall) and given to Cobbler only as its SHA-512 crypt(3)
hash (step 2's record, tasks/cobbler/systems.py). Never logged."""

from __future__ import annotations

import secrets
from typing import Any

from passlib.hash import sha512_crypt
from prefect.blocks.system import Secret
from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from store_rollout.contracts import ROOT_PASSWORD_HASH_META
from store_rollout.inventory import Store
from tasks.blocks import load_secret

# A hypervisor's root password, typed by a technician at its console (BMC or local keyboard):
# no look-alikes (0 O 1 l I) and no y/z, which QWERTZ keyboards swap; 20 of these 52 characters
# are 114 bits
ROOT_PASSWORD_ALPHABET = "23456789abcdefghijkmnpqrstuvwxABCDEFGHJKLMNPQRSTUVWX"
ROOT_PASSWORD_LENGTH = 20
ROOT_HASH_ROUNDS = 656000  # SHA-512 crypt's rounds (docs/production.md)


def root_password_block_name(store_id: str) -> str:
    """The Prefect Secret block holding the root password of a store's hypervisor."""
    return f"store-{store_id}-root-password"


def store_root_password(store_id: str) -> SecretStr:
    """The root password of a store's hypervisor, from its Secret block; the first call makes a
    random one and saves it there (a rerun, or a reinstall, reuses it; an operator reads it in the
    UI, or sets it before the first install). Never logged."""
    name = root_password_block_name(store_id)
    password = SecretStr("".join(secrets.choice(ROOT_PASSWORD_ALPHABET)
                                 for _ in range(ROOT_PASSWORD_LENGTH)))
    # "name already in use" yet not found by the next read: seen when several stores' first
    # installs started at once on a fresh Prefect server (the full lab); read again, then save
    for attempt in Retrying(stop=stop_after_attempt(4), wait=wait_exponential(multiplier=0.5, max=4),
                            retry=retry_if_exception_type(ValueError), reraise=True):
        with attempt:
            stored = load_secret(name)
            if stored is not None:
                return stored
            try:
                Secret(value=password).save(name, overwrite=False)
            except ValueError as exc:
                raise ValueError(f"Secret block {name!r}: {exc}") from exc
            return password
    raise AssertionError("unreachable: Retrying re-raises")


def root_password_hash(password: SecretStr, current: str = "") -> str:
    """SHA-512 crypt(3) of a root password (`$6$`, what glibc and YaST take). `current`, the
    hash Cobbler holds, is kept when it is of this password and of ROOT_HASH_ROUNDS: a rerun
    changes nothing."""
    secret = password.get_secret_value()
    if current and sha512_crypt.identify(current):
        try:
            if (sha512_crypt.from_string(current).rounds == ROOT_HASH_ROUNDS
                    and sha512_crypt.verify(secret, current)):
                return current
        except ValueError:  # malformed: replaced below
            pass
    # docs/production.md's 656000 rounds (passlib's default): an operator may choose a weaker
    # password than the generated 114 bits, and Cobbler served the hash during the install
    return str(sha512_crypt.using(rounds=ROOT_HASH_ROUNDS).hash(secret))


def store_root_password_hash(store: Store, record: dict[str, Any] | None) -> str:
    """crypt(3) of the store's root password (its Secret block, made on the first install) for
    its Cobbler record: the hash the record already holds when it is of that password."""
    meta = (record or {}).get("autoinstall_meta")
    current = str(meta.get(ROOT_PASSWORD_HASH_META) or "") if isinstance(meta, dict) else ""
    return root_password_hash(store_root_password(store.store_id), current)


def registration_code(block: str) -> str:
    """The chain's SLES registration code, from the Secret block the settings name
    (registration_code_block); empty when none is named (RMT and SUSE Manager register without
    one). Goes only into the host's Cobbler record, which step 4 clears. Never logged."""
    if not block:
        return ""
    code = load_secret(block)
    if code is None:
        raise ValueError(f"registration_code_block: no Secret block {block!r}: save the "
                         "registration code in it (Prefect UI, Blocks) or name another")
    return code.get_secret_value()
