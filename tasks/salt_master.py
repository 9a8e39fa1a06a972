"""Prefect tasks on the Salt master: wait for a hypervisor's ready event (step 3), a VM's
minion key and one-time autosign token (step 4), removing them (rollback).

The client they use (bus, keys, tokens, LocalClient) and step 3's watcher are in tasks/salt/.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from store_rollout import step_rules
from store_rollout.inventory import Store
from store_rollout.settings_parts import CobblerSettings, SaltSettings
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.cobbler import CobblerUnavailable, cobbler_client, forget_install_secrets
from tasks.notifications import announce_hypervisor_ready, end_hypervisor_wait
from tasks.retry import SALT_KEYS_RETRY, SALT_WAIT_RETRY
from tasks.salt import HypervisorReadyWatcher, SaltTransientError, master_client
from tasks.salt.probes import domain_with_current_extensions
from tasks.salt.store_keys import forget_store_minions

__all__ = ["prepare_vm_keys", "remove_store_keys", "remove_vm_key", "wait_for_hypervisor"]


@task(name="wait_for_hypervisor", **SALT_WAIT_RETRY.on(SaltTransientError))
def wait_for_hypervisor(store: Store, salt: SaltSettings,
                        timeout: float = STEP_TIMEOUTS.hypervisor_timeout,
                        already_ready: bool = False,
                        stall_timeout: float = STEP_TIMEOUTS.hypervisor_stall_timeout
                        ) -> dict[str, Any]:
    """Step 3: wait for the hypervisor's ready event (last state of its highstate).

    `already_ready`: step 2 found the hypervisor ready a moment ago (a rerun) and skipped the
    install; that answer stands and no second probe is made. A hypervisor that has answered
    for `stall_timeout` seconds without getting ready and runs no state has its highstate
    applied again, once per attempt. The hypervisor's one-time autosign token is revoked once
    it is ready, and a host whose SMBIOS serial is not the inventory's `hypervisor.serial`
    fails the step before step 4 (tasks/salt/watchers.py, `HypervisorReadyWatcher`).
    """
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    logger.info("store %s: waiting up to %.0fs for hypervisor %s", store.store_id, timeout,
                store.hypervisor_minion_id)
    watcher = HypervisorReadyWatcher(master, store.store_id, store.hypervisor_minion_id,
                                     timeout=timeout, stall_timeout=stall_timeout, logger=logger,
                                     serial=store.hypervisor.serial)
    try:
        ready = watcher.wait(already_ready)
    except BaseException:
        end_hypervisor_wait(store.store_id)
        raise
    announce_hypervisor_ready(store.store_id, store.hypervisor_minion_id)
    return ready


@task(name="prepare_vm_keys", **SALT_KEYS_RETRY.on(SaltTransientError, CobblerUnavailable))
def prepare_vm_keys(store: Store, salt: SaltSettings, cobbler: CobblerSettings) -> dict[str, Any]:
    """Step 4: the installed host's Cobbler record without its one-time token and root hash
    (step 3 saw it ready: it needs neither again), then delete a stale key of the VM's minion
    id (exact id) and issue its one-time autosign token. A VM already running with an
    accepted key keeps it (rerun)."""
    logger = get_run_logger()
    forgotten = forget_install_secrets(store, cobbler_client(cobbler))
    if forgotten:
        logger.info("store %s: Cobbler system %s no longer holds %s", store.store_id,
                    store.cobbler_system, ", ".join(forgotten))
    master = master_client(salt.salt_master_config)
    minion = store.vm_minion_id
    # the hypervisor's storevirt as the master has it (steps 4-6 call it); a key is stale only
    # when its VM is going to be created anew (step_rules.vm_key_kept)
    domain, synced = domain_with_current_extensions(master, store.hypervisor_minion_id,
                                                    store.vm_name)
    if synced:
        logger.info("store %s: %s synced %s", store.store_id, store.hypervisor_minion_id,
                    ", ".join(synced))
    if step_rules.vm_key_kept(domain, lambda: master.key_state(minion)):
        logger.info("store %s: VM %s exists and its key is accepted; keeping it",
                    store.store_id, minion)
        return {"minion": minion, "deleted_stale_key": False, "token_issued": False,
                "extensions_synced": synced}
    deleted = master.delete_key(minion)
    master.issue_token(minion)
    logger.info("store %s: VM minion %s: stale key deleted: %s; one-time token issued",
                store.store_id, minion, deleted)
    return {"minion": minion, "deleted_stale_key": deleted, "token_issued": True,
            "extensions_synced": synced}


@task(name="remove_vm_key", task_run_name="remove-vm-key-{store.store_id}")
def remove_vm_key(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """Rollback: delete the VM's key (exact id) and revoke its autosign token."""
    master = master_client(salt.salt_master_config)
    minion = store.vm_minion_id
    result = {"minion": minion, "key_deleted": master.delete_key(minion),
              "token_revoked": master.revoke_token(minion)}
    get_run_logger().info("store %s: VM key removal %s", store.store_id, result)
    return result


@task(name="remove_store_keys", task_run_name="remove-keys-{store.store_id}",
      **SALT_KEYS_RETRY.on(SaltTransientError))
def remove_store_keys(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """Decommission: forget_store_minions."""
    forgotten = forget_store_minions(master_client(salt.salt_master_config), store)
    get_run_logger().info("store %s: keys deleted: %s; tokens revoked: %s", store.store_id,
                          forgotten["keys_deleted"] or "none left",
                          forgotten["tokens_revoked"] or "none left")
    return forgotten
