"""Store inventory: the validated model (`models`) and its files, YAML or an ERP's CSV
export (`files`). Import from `store_rollout.inventory`."""

from __future__ import annotations

from store_rollout.inventory.files import DEFAULT_INVENTORY, load_inventory, parse_inventory
from store_rollout.inventory.models import (
    ErpSpec,
    HypervisorSpec,
    Inventory,
    InventoryError,
    Store,
    VmSpec,
)

__all__ = [
    "DEFAULT_INVENTORY",
    "ErpSpec",
    "HypervisorSpec",
    "Inventory",
    "InventoryError",
    "Store",
    "VmSpec",
    "load_inventory",
    "parse_inventory",
]
