"""Loading a named Prefect Block with its own type (the client factories' one way in), and the
per-store secrets the rollout keeps in Prefect Secret blocks (each hypervisor's root password)."""

from __future__ import annotations

import secrets
from typing import Any, TypeVar, cast

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from prefect.exceptions import ObjectNotFound
from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

B = TypeVar("B", bound=Block)

# A hypervisor's root password, typed by a technician at its console (BMC or local keyboard):
# no look-alikes (0 O 1 l I) and no y/z, which QWERTZ keyboards swap; 20 of these 52 characters
# are 114 bits
ROOT_PASSWORD_ALPHABET = "23456789abcdefghijkmnpqrstuvwxABCDEFGHJKLMNPQRSTUVWX"
ROOT_PASSWORD_LENGTH = 20


def load_block(block_type: type[B], name: str) -> B:
    """`block_type.load(name)` from synchronous code; a missing Block says which setting named it.

    `Block.load` is typed as "block or coroutine" (it is sync/async dual); called from sync code
    it returns the Block."""
    try:
        return cast(B, block_type.load(name))
    except ValueError as exc:
        raise ValueError(f"no {block_type.get_block_type_name()} Block named {name!r} on the "
                         f"Prefect server (check STORE_ROLLOUT_*_CREDENTIALS_BLOCK): {exc}") from exc


def secret_of(block_name: str, setting: str) -> SecretStr:
    """The text of the Prefect Secret block `block_name` (named by the setting `setting`): a
    secret setting's one source besides a Credentials Block."""
    if not block_name:
        raise ValueError(f"{setting} names no Secret block: save the secret in a Prefect Secret "
                         f"block and set {setting} to its name")
    secret = _load_secret(block_name)
    if secret is None:
        raise ValueError(f"no Secret block named {block_name!r} on the Prefect server (check "
                         f"{setting})")
    return secret


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
            stored = _load_secret(name)
            if stored is not None:
                return stored
            try:
                Secret(value=password).save(name, overwrite=False)
            except ValueError as exc:
                raise ValueError(f"Secret block {name!r}: {exc}") from exc
            return password
    raise AssertionError("unreachable: Retrying re-raises")


def secret_text(name: str) -> Any:
    """The value of the Secret block `name` as saved (not Secret.get(): it would json-decode
    "1234"); None when there is no such block. Loaded synchronously even where an event loop
    runs (a caller under Playwright's or Prefect's loop would get a coroutine)."""
    try:
        block: Any = Secret.load(name, _sync=True)  # type: ignore[call-arg]
    except ValueError as exc:
        if isinstance(exc.__cause__, ObjectNotFound):
            return None
        raise
    return block.value.get_secret_value()


def _load_secret(name: str) -> SecretStr | None:
    """The text of the Secret block `name`; None when there is no such block."""
    value = secret_text(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"Secret block {name!r} holds no password (a non-empty string): set one "
                         "in the Prefect UI, or delete the block to have a new one generated")
    return SecretStr(value)
