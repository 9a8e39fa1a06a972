"""Store inventory: the validated model (`models`) and its files, YAML or an ERP's CSV
export (`files`). What other packages use is exported here (`__all__`, pinned by
tests/structure/test_public_surface.py)."""

from __future__ import annotations

from store_rollout.inventory.files import DEFAULT_INVENTORY, load_inventory, parse_inventory
from store_rollout.inventory.models import InventoryError, Store

__all__ = ["DEFAULT_INVENTORY", "InventoryError", "Store", "load_inventory", "parse_inventory"]
