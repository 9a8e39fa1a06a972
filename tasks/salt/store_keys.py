"""A store's minions forgotten by the master: their one-time autosign tokens revoked and their
keys deleted, in any state (the decommission's key removal, tasks/salt_master.py, and a
replacement's retirement of the old box, tasks/retire_box.py)."""

from __future__ import annotations

from typing import Any

from store_rollout.inventory import Store
from tasks.salt.client import SaltMasterClient


def forget_store_minions(master: SaltMasterClient, store: Store) -> dict[str, Any]:
    """The store's host and VM unknown to the master: their autosign tokens revoked, then their
    keys, in any state, deleted in one call (the master rotates its AES key once, not once per
    key). Decommission and a replacement's retirement of the old box."""
    minions = [store.hypervisor_minion_id, store.vm_minion_id]
    revoked = [m for m in minions if master.revoke_token(m)]
    return {"keys_deleted": master.delete_keys(minions), "tokens_revoked": revoked}
