"""A replacement's first change (`store-rollout replace`): the store's old box retired before
step 2 installs the new one, through the guard (store_rollout/guard.py)."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from store_rollout import step_rules
from store_rollout.guard import Action, Consent
from store_rollout.inventory import Store
from store_rollout.settings_parts import BmcSettings, CalendarSettings, CobblerSettings, SaltSettings
from tasks.bmc import BmcError, bmc_client
from tasks.cobbler import CobblerUnavailable, cobbler_client
from tasks.retry import SALT_KEYS_RETRY
from tasks.salt import SaltTransientError, master_client
from tasks.salt.store_keys import forget_store_minions
from tasks.windows import guarded_window


@task(name="retire_old_box", task_run_name="retire-old-box-{old.store_id}",
      **SALT_KEYS_RETRY.on(CobblerUnavailable, SaltTransientError))
def retire_old_box(old: Store, new: Store, consent: Consent | None = None, *, salt: SaltSettings,
                   cobbler: CobblerSettings, power: BmcSettings,
                   calendar: CalendarSettings) -> dict[str, Any]:
    """A replacement, before step 2: the old box powered off through its BMC (a BMC that does
    not answer, a destroyed box, is logged and left), then the store's minions forgotten
    (forget_store_minions), so the new box's install and VM sign in afresh; only as the guard
    lets it (asked for by name: replace_box, approved, in a window with room for the old box's
    retirement and steps 2 to 5), else it changes nothing and returns `window`. Nothing when
    the store's record already holds the new box's MAC (a rerun: step 2 moved it)."""
    logger = get_run_logger()
    record = cobbler_client(cobbler).get_system(old.cobbler_system) or {}
    macs = [i.get("mac_address") for i in record.get("interfaces", {}).values()]
    if step_rules.old_box_retired([m for m in macs if m], new.hypervisor.mac):
        logger.info("store %s: its record is on the new box %s already", old.store_id,
                    new.hypervisor.mac)
        return {"old_mac": old.hypervisor.mac, "retired_before": True}
    window, authorization = guarded_window(Action.REPLACE_BOX, old, consent or Consent(),
                                           calendar, logger)
    if not window["go"]:
        return {"old_mac": old.hypervisor.mac, "window": window}
    try:
        bmc = bmc_client(old, power)
        if bmc.power_state() == "on":
            bmc.power_off()
        left = "off"
    except BmcError as exc:
        logger.warning("store %s: the old box's BMC: %s; taken for gone", old.store_id, exc)
        left = "unreachable"
    forgotten = forget_store_minions(master_client(salt.salt_master_config), old)
    logger.info("store %s: old box %s %s; keys deleted: %s", old.store_id, old.hypervisor.mac,
                left, forgotten["keys_deleted"] or "none")
    return {"old_mac": old.hypervisor.mac, "retired_before": False, "power": left,
            "authorization": authorization, **forgotten}
