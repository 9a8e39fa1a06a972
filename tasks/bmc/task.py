"""The BMC's own task: a store host powered off for good (the decommission)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task

from store_rollout.inventory import Store
from store_rollout.settings_parts import BmcSettings
from tasks.bmc.blocks import bmc_client
from tasks.bmc.client import Bmc
from tasks.bmc.errors import BmcRejected, BmcUnreachable
from tasks.retry import BMC_RETRY


@task(name="power_off_hypervisor", task_run_name="power-off-{store.store_id}",
      **BMC_RETRY.on(BmcUnreachable))
def power_off_hypervisor(store: Store, power: BmcSettings) -> dict[str, Any]:
    """Decommission: the host shut down through its BMC, its OS first (a graceful shutdown,
    waited for up to the `graceful_shutdown_seconds` setting), its power cut only when it is
    still on then; a host already off is left so."""
    bmc = bmc_client(store, power)
    logger = get_run_logger()
    was = bmc.power_state()
    graceful = False
    if was != "off":
        graceful = shut_down_gracefully(bmc, power.graceful_shutdown_seconds, time.sleep,
                                        logger)
        if not graceful:
            bmc.power_off()
    logger.info("store %s: %s: host was %s, now off (%s)", store.store_id, bmc.label, was,
                "shut down by its OS" if graceful else "power cut" if was != "off" else "left")
    return {"bmc": bmc.label, "was": was, "powered_off": was != "off", "graceful": graceful}


def shut_down_gracefully(bmc: Bmc, grace_seconds: float, sleep: Callable[[float], None],
                         logger: Any) -> bool:
    """Ask the host's OS to shut down and wait until the BMC says it is off, polling every
    2 s; False when it is still on after `grace_seconds` (or the BMC refused the request)."""
    try:
        bmc.shutdown()
    except BmcRejected as exc:
        logger.warning("%s: graceful shutdown refused (%s); cutting the power", bmc.label, exc)
        return False
    waited = 0.0
    while waited < grace_seconds:
        sleep(min(2.0, grace_seconds - waited))
        waited += 2.0
        if bmc.power_state() == "off":
            return True
    logger.warning("%s: still on %.0f s after the graceful shutdown; cutting the power",
                   bmc.label, grace_seconds)
    return False
