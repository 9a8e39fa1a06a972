"""Undo a store rollout: VM destroyed and undefined, overlay removed, VM key deleted, Cobbler
netboot off. Runs on cancellation of a rollout, or on request (`store-rollout rollback`)."""

from __future__ import annotations

from typing import Any

from prefect import flow, tags

from store_rollout.inventory import load_inventory
from tasks.cobbler import disable_hypervisor_netboot
from tasks.salt_master import remove_vm_key
from tasks.virt import remove_vm

DEFAULT_INVENTORY = "examples/inventory.yaml"


@flow(name="store-rollback", flow_run_name="rollback-{store_id}")
def store_rollback(store_id: str, inventory: str = DEFAULT_INVENTORY) -> dict[str, Any]:
    """Reverse order of the rollout; every step is idempotent.

    Args:
        store_id: The store to roll back, as written in the inventory (e.g. 0001).
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
    """
    store = load_inventory(inventory).get(store_id)
    with tags(f"store-{store_id}", "store-rollback"):
        vm = remove_vm(store)
        key = remove_vm_key(store)
        cobbler = disable_hypervisor_netboot(store)
    return {"store_id": store_id, "vm": vm, "key": key, "cobbler": cobbler}
