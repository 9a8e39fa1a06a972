"""Loading a named Prefect Block with its own type (the client factories' one way in)."""

from __future__ import annotations

from typing import TypeVar, cast

from prefect.blocks.core import Block

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
