"""Prefect Blocks as the tasks read them: a named Block loaded with its own type (the client
factories' one way in), and the text of a Secret block (a secret setting's source besides a
Credentials Block, an approver's seeds, a store host's root password: tasks/root_password.py)."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from prefect.exceptions import ObjectNotFound
from pydantic import SecretStr

B = TypeVar("B", bound=Block)


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
    secret = load_secret(block_name)
    if secret is None:
        raise ValueError(f"no Secret block named {block_name!r} on the Prefect server (check "
                         f"{setting})")
    return secret


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


def load_secret(name: str) -> SecretStr | None:
    """The text of the Secret block `name`; None when there is no such block."""
    value = secret_text(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"Secret block {name!r} holds no password (a non-empty string): set one "
                         "in the Prefect UI, or delete the block to have a new one generated")
    return SecretStr(value)
