"""A store on another box (`store-rollout replace`): the inventory's store with the new host's
fields, checked as the inventory's are."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from store_rollout.inventory.bmc import bmc_identity
from store_rollout.inventory.fields import refreshed_minion_id
from store_rollout.inventory.models import HypervisorSpec, Inventory, InventoryError, Store

# what a replacement gives of its new box
BOX_FIELDS = ("mac", "power_type", "power_address", "power_port", "redfish_system_id",
              "bmc_credentials_block", "ipmi_cipher_suite", "serial")


def refuse_box_fields(box: dict[str, Any], fields: tuple[str, ...], what: str, store_id: str,
                      mac: str = "mac") -> None:
    """InventoryError unless `box` gives a MAC and only `fields` (what a replacement or a
    refresh takes of its new box); `what` and `mac` are how the refusal names them."""
    unknown = sorted(set(box) - set(fields))
    if unknown or not box.get("mac"):
        raise InventoryError(
            f"{what}: {'unknown ' + ', '.join(unknown) if unknown else 'mac missing'} "
            f"(store {store_id}); give the new box's {mac} and, where they differ from the old "
            f"box's, {', '.join(fields[1:])}")


def with_new_box(inventory: Inventory, store_id: str, box: dict[str, Any]) -> Store:
    """The store on the box `box` describes: its `mac` (required) and, where they differ from
    the old box's, the other BOX_FIELDS; its serial is the new box's or none (the old box's
    cannot be the new one's). Refused naming the field: an unknown or invalid one, or a MAC
    another store of the inventory has."""
    store = inventory.get(store_id)
    refuse_box_fields(box, BOX_FIELDS, "replace_box", store_id)
    fields = {**store.hypervisor.model_dump(exclude_none=True, exclude={"serial"}), **box}
    if store.hypervisor.minion_id and box.get("mac"):
        # a refreshed box's id ends in its MAC's digits: the replacement's in its own
        fields["minion_id"] = refreshed_minion_id(store_id, str(box["mac"]))
    try:
        hypervisor = HypervisorSpec.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"hypervisor.{'.'.join(str(p) for p in err['loc']) or 'box'}: "
            f"{err['msg'].removeprefix('Value error, ')}" for err in exc.errors())
        raise InventoryError(f"replace_box of store {store_id}: {problems}") from None
    taken = [s.store_id for s in inventory.stores
             if s.store_id != store_id and s.hypervisor.mac == hypervisor.mac]
    if taken:
        raise InventoryError(f"replace_box.mac {hypervisor.mac}: the MAC of store {taken[0]}'s "
                             "host in the inventory; give the new box's own")
    def identity(hv: HypervisorSpec) -> tuple[str, str, str] | None:
        return bmc_identity(hv.power_address, hv.power_type, hv.power_port,
                            hv.redfish_system_id)

    shared = [s.store_id for s in inventory.stores if s.store_id != store_id
              and identity(hypervisor) and identity(s.hypervisor) == identity(hypervisor)]
    if shared:
        raise InventoryError(f"replace_box.power_address {hypervisor.power_address}: the BMC of "
                             f"store {shared[0]}'s host in the inventory (same address and "
                             "port); give the new box's own BMC")
    return store.model_copy(update={"hypervisor": hypervisor})
