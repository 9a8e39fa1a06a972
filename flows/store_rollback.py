"""Undo a store rollout: VM destroyed and undefined, overlay removed, VM key deleted, Cobbler
netboot off. Runs on cancellation of a rollout, or on request (`store-rollout rollback`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from prefect import flow, tags

from store_rollout.inventory import DEFAULT_INVENTORY, load_inventory
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.cobbler import disable_hypervisor_netboot
from tasks.preflight import check_region
from tasks.run_health import beating, this_flow_run
from tasks.salt_master import remove_vm_key
from tasks.slots import store_owner
from tasks.virt import remove_vm


@flow(name="store-rollback", flow_run_name="rollback-{store_id}")
@beating
def store_rollback(store_id: str, inventory: str = DEFAULT_INVENTORY,
                   owner_wait_seconds: float = STEP_TIMEOUTS.owner_wait_seconds,
                   own_store: bool = True) -> dict[str, Any]:
    """Reverse order of the rollout; every step is idempotent.

    Args:
        store_id: The store to roll back, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        owner_wait_seconds: Seconds to wait while a rollout or another rollback of this store
            runs; then this run fails naming that run, having changed nothing.
        own_store: False only for the rollback a cancelled rollout runs for itself (the
            rollout owned the store).
    """
    store = load_inventory(inventory).get(store_id)
    check_region(store)
    owner = (store_owner(store_id, owner_wait_seconds, this_flow_run()) if own_store
             else nullcontext())
    with owner, tags(f"store-{store_id}", "store-rollback"):
        vm = remove_vm(store)
        key = remove_vm_key(store)
        cobbler = disable_hypervisor_netboot(store)
    return {"store_id": store_id, "vm": vm, "key": key, "cobbler": cobbler}
