"""Step 6: following the store VM through `provisioning_helper.firstboot`, then retiring its
bootstrap data.

The VM runs firstboot by itself (startup_states from the image's bootstrap minion.d file);
this task only watches (`FirstbootWatcher`, tasks/salt/firstboot_watcher.py), then checks the VM's
bootstrap files are gone and has the hypervisor eject and delete its identity seed.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task

from store_rollout.inventory import Store
from store_rollout.settings_parts import ImageSettings, SaltSettings
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.retry import SALT_WAIT_RETRY
from tasks.salt import (
    FirstbootFailed,
    FirstbootWatcher,
    SaltTransientError,
    master_client,
)
from tasks.store_link import LinkedCalls, StoreCalls, StoreLink


def image_master_endpoint(salt: SaltSettings, images: ImageSettings) -> tuple[str, str]:
    """The master address and port the VM's image was built with (what its minion dials)."""
    return (images.image_params.get("SALT_MASTER", salt.salt_master_address),
            images.image_params.get("SALT_MASTER_PORT", str(salt.salt_ret_port)))


def retire_bootstrap(master: StoreCalls, store: Store) -> dict[str, Any]:
    """Fail when the VM kept any bootstrap file; then the hypervisor's half of the bootstrap
    data, the seed disk with the one-time token, is ejected and deleted. Returns the seed's
    {seed, state}."""
    minion = store.vm_minion_id
    leftovers = [p for p in master.cmd(minion, "provisioning.bootstrap_files")
                 if master.cmd(minion, "file.file_exists", [p])]
    if leftovers:
        raise FirstbootFailed(store.store_id, minion, [], f"bootstrap files left: {leftovers}")
    seed: dict[str, Any] = master.cmd(store.hypervisor_minion_id, "storevirt.retire_seed",
                                      [store.vm_name])
    return seed


@task(name="firstboot", **SALT_WAIT_RETRY.on(SaltTransientError))
def firstboot(store: Store, salt: SaltSettings, images: ImageSettings,
              timeout: float = STEP_TIMEOUTS.firstboot_timeout,
              stall_timeout: float = STEP_TIMEOUTS.vm_stall_timeout,
              contact_timeout: float = STEP_TIMEOUTS.vm_contact_timeout) -> dict[str, Any]:
    """Step 6: reboot, highstate, report, reboot and verify, bootstrap config removed, then
    the identity seed ejected from the VM and deleted on the hypervisor. A store whose link
    goes down meanwhile is waited for, up to `store_link_wait_seconds` (tasks/store_link.py).

    A VM whose accepted minion stays silent for `stall_timeout` (hung after a reboot) is reset
    once per attempt. A VM whose minion never contacts the master (no key, no event) within
    `contact_timeout` fails the step at once, naming the master address the image was built
    with: no wait for the whole `timeout`.

    The result has the time of each stage event and each minion start (seconds into the step)
    and the kernel's boot id each stage ran under: two reboots show as three boot ids.
    """
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    started = time.monotonic()
    link = StoreLink(master, store, salt.store_link_wait_seconds)
    booted = FirstbootWatcher(master, store, timeout=timeout, stall_timeout=stall_timeout,
                              contact_timeout=contact_timeout,
                              master_endpoint=image_master_endpoint(salt, images),
                              logger=logger, link=link.hold).wait()
    seed = retire_bootstrap(LinkedCalls(master, link), store)
    logger.info("store %s: identity seed %s ejected and deleted", store.store_id, seed["seed"])
    logger.info("store %s: firstboot done in %.1fs", store.store_id, time.monotonic() - started)
    return {**booted, "seed_retired": seed["state"] == "retired", "link_outages": link.outages,
            "seconds": round(time.monotonic() - started, 3)}
