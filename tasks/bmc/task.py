"""The BMC's own task: a store host powered off for good (the decommission)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from store_rollout.inventory import Store
from store_rollout.settings import load_settings
from tasks.bmc.blocks import bmc_client
from tasks.bmc.errors import BmcUnreachable
from tasks.retry import retry_on


@task(name="power_off_hypervisor", task_run_name="power-off-{store.store_id}",
      retries=2, retry_delay_seconds=[5, 15], retry_condition_fn=retry_on(BmcUnreachable))
def power_off_hypervisor(store: Store) -> dict[str, Any]:
    """Decommission: the host powered off through its BMC; a host already off is left so."""
    bmc = bmc_client(store, load_settings())
    was = bmc.power_state()
    if was != "off":
        bmc.power_off()
    get_run_logger().info("store %s: %s: host was %s, now off", store.store_id, bmc.label, was)
    return {"bmc": bmc.label, "was": was, "powered_off": was != "off"}
