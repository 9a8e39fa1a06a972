"""Prefect tasks on the Salt master: wait for a hypervisor's ready event (step 3), a VM's
minion key and one-time autosign token (step 4), removing them (rollback).

The client they use (bus, keys, tokens, LocalClient) is tasks/salt_client.py; its names stay
importable from here, where other modules and tests have always found them.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task

from store_rollout.contracts import (
    AUTOSIGN_GRAIN,
    AUTOSIGN_REFUSED_TAG,
    HYPERVISOR_READY_GRAIN,
    HYPERVISOR_READY_TAG,
)
from store_rollout.inventory import Store
from store_rollout.settings import load_settings
from tasks.retry import retry_on
from tasks.salt_client import (
    MINION_ID_RE,
    AuthRefusal,
    SaltCommandFailed,
    SaltError,
    SaltEvent,
    SaltEventTimeout,
    SaltMasterClient,
    SaltMasterUnavailable,
    SaltMinionNoResponse,
    SaltTransientError,
    check_minion_id,
    failed_states,
    hypervisor_ready,
    hypervisor_state,
    master_client,
    new_autosign_token,
    summarize_failure,
)

__all__ = [
    # re-exported: the client and the contracts, as importers of this module know them
    "AUTOSIGN_GRAIN", "HYPERVISOR_READY_GRAIN", "HYPERVISOR_READY_TAG", "MINION_ID_RE",
    "SaltCommandFailed", "SaltError", "SaltEvent", "SaltEventTimeout", "SaltMasterClient",
    "SaltMasterUnavailable", "SaltMinionNoResponse", "SaltTransientError", "check_minion_id",
    "failed_states", "hypervisor_ready", "hypervisor_state", "master_client",
    "new_autosign_token", "summarize_failure",
    # the tasks and their helpers
    "HypervisorKeyContested", "HypervisorMinionRefused", "contested_key", "prepare_vm_keys",
    "reapply_highstate", "remove_vm_key", "wait_for_hypervisor",
]


def reapply_highstate(master: SaltMasterClient, minion_id: str) -> str | None:
    """Start the highstate of a hypervisor that is up but never got ready (its startup run was
    lost); None when a state run is still going, so two never overlap. Returns the job id."""
    running = master.cmd(minion_id, "saltutil.running", timeout=10) or []
    if any(str(job.get("fun", "")).startswith("state.") for job in running):
        return None
    return master.cmd_async(minion_id, "state.highstate")


class HypervisorMinionRefused(SaltError):
    """The master refuses the hypervisor's minion: no wait can end well (not retried)."""

    def __init__(self, store_id: str, refusal: AuthRefusal, master_config: str) -> None:
        super().__init__(
            f"store {store_id}: the Salt master refuses hypervisor minion {refusal.minion}: it "
            f"signs in with auth protocol {refusal.version}, the master requires at least "
            f"{refusal.minimum} (minimum_auth_version). Fix one of: run a minion that speaks "
            f"protocol {refusal.minimum} on the host (Salt 3006.10 or later, e.g. "
            f"the upstream 3006 LTS onedir; docs/production.md, 'Salt on the store hosts'), or "
            f"set `minimum_auth_version: {refusal.version}` in {master_config} and restart the "
            "master (it then accepts the older protocol from every minion)")
        self.refusal = refusal


class HypervisorKeyContested(SaltError):
    """Two keys claim the hypervisor's id: its one-time token was used by another machine
    before (or after) the host itself. Nothing goes on with either (not retried)."""

    def __init__(self, store_id: str, minion: str, fingerprints: dict[str, list[str]]) -> None:
        accepted = ", ".join(fingerprints.get("minions", [])) or "none"
        denied = ", ".join(fingerprints.get("minions_denied", [])) or "none"
        super().__init__(
            f"store {store_id}: two keys claim hypervisor minion {minion}: accepted {accepted}, "
            f"denied {denied}. Another machine on the store network signed in with the host's "
            "one-time token (the install profile was read): both keys were removed and nothing "
            "was sent to either. Check the store network, then rerun the rollout: it "
            f"reinstalls the host with a new token (docs/design.md, 'Threat model')")
        self.minion, self.fingerprints = minion, fingerprints


def contested_key(master: SaltMasterClient, store_id: str, minion: str) -> None:
    """Fail when the hypervisor's id has an accepted key and a denied one (the master denies a
    later key for an accepted id), after removing both."""
    keys = master.list_keys()
    if minion in keys.get("minions", []) and minion in keys.get("minions_denied", []):
        fingerprints = master.fingerprints(minion)
        master.delete_key(minion)
        raise HypervisorKeyContested(store_id, minion, fingerprints)


def _describe(event: SaltEvent | None) -> str:
    if event is None:
        return "none"
    detail = {k: event.data.get(k) for k in ("act", "fun", "retcode") if k in event.data}
    return f"{event.tag} {detail or ''}".strip()


@task(name="wait_for_hypervisor", task_run_name="wait-hypervisor-{store.store_id}",
      retries=1, retry_delay_seconds=5, retry_condition_fn=retry_on(SaltTransientError))
def wait_for_hypervisor(store: Store, timeout: float = 900,
                        already_ready: bool = False,
                        stall_timeout: float = 300) -> dict[str, Any]:
    """Step 3: wait for the hypervisor's ready event (last state of its highstate).

    Subscribes first, then checks the current state, so an event fired before subscribing is
    not missed. `already_ready`: step 2 found the hypervisor ready a moment ago (a rerun) and
    skipped the install; that answer stands and no second probe is made. A hypervisor that has
    answered for `stall_timeout` seconds without getting ready and runs no state has its
    highstate applied again, once per attempt. The hypervisor's one-time autosign token is
    revoked once it is ready.
    """
    logger = get_run_logger()
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    minion = store.hypervisor_minion_id
    last: dict[str, SaltEvent] = {}

    def seen(event: SaltEvent) -> None:
        if event.minion == minion or event.tag.startswith(f"salt/minion/{minion}/"):
            last["event"] = event
        if event.tag == AUTOSIGN_REFUSED_TAG and event.data.get("token_of") == minion:
            logger.warning("store %s: minion %r signed in with hypervisor %s's one-time token "
                           "(key %s) and was removed by the master's autosign guard: someone on "
                           "the store network read the install profile", store.store_id,
                           event.data.get("id"), minion, event.data.get("fingerprint"))

    started = time.monotonic()
    deadline = started + timeout
    ready = already_ready
    answering_since: float | None = None
    reapplied: str | None = None

    master_log = master.log_tail()

    def check() -> bool:
        nonlocal answering_since, reapplied
        refused = master_log.auth_refusals(minion)
        if refused:
            raise HypervisorMinionRefused(store.store_id, refused[-1], master.master_config)
        contested_key(master, store.store_id, minion)
        state = hypervisor_state(master, minion)
        now = time.monotonic()
        answering_since = None if state == "silent" else answering_since or now
        up_for = now - (answering_since or now)
        if state == "answering" and reapplied is None and up_for >= stall_timeout:
            reapplied = reapply_highstate(master, minion)
            if reapplied:
                logger.warning("store %s: hypervisor %s up for %.0fs but not ready and running "
                               "no state; highstate applied again (job %s)", store.store_id,
                               minion, up_for, reapplied)
        return state == "ready"

    while not ready:
        # the event is the fast path; the ready grain, checked after (re)subscribing and every
        # few seconds, covers events fired before we listened or lost in a master restart
        try:
            with master.subscribe("") as bus:
                ready = check()
                while not ready and time.monotonic() < deadline:
                    try:
                        master.wait_for_event(
                            bus, lambda e: e.tag == HYPERVISOR_READY_TAG and e.minion == minion,
                            timeout=min(10.0, max(0.1, deadline - time.monotonic())),
                            what=HYPERVISOR_READY_TAG, seen=seen)
                        ready = True
                    except SaltEventTimeout:
                        ready = check()
        except (SaltEventTimeout, HypervisorMinionRefused, HypervisorKeyContested):
            raise
        except Exception as exc:  # the master's bus went away (restart): subscribe again
            logger.warning("store %s: event bus lost (%s); resubscribing", store.store_id, exc)
            time.sleep(1)
        if not ready and time.monotonic() >= deadline:
            raise SaltEventTimeout(
                f"store {store.store_id}: hypervisor minion {minion} sent no "
                f"{HYPERVISOR_READY_TAG} within {timeout:.0f}s; last event from it: "
                f"{_describe(last.get('event'))}; key state: {master.key_state(minion)}")
    # a ready event proves nothing about whose key sent it: look once more at the keys
    contested_key(master, store.store_id, minion)
    if time.monotonic() - started < 0.5:
        logger.info("store %s: hypervisor %s already ready", store.store_id, minion)
    revoked = master.revoke_token(minion)
    logger.info("store %s: hypervisor %s ready after %.1fs (token revoked: %s)",
                store.store_id, minion, time.monotonic() - started, revoked)
    return {"minion": minion, "waited_seconds": round(time.monotonic() - started, 3),
            "highstate_reapplied": reapplied}


def sync_hypervisor_modules(master: SaltMasterClient, minion_id: str) -> list[str]:
    """The project's modules on the hypervisor as the master has them now, before steps 4-6 call
    them (its last highstate synced them; a rerun may come after a project update).

    Cheaper than a bare `saltutil.sync_modules` (1-2 s a rerun, issue 28) with the same result:
    the environment is named (the default renders the hypervisor's top file to find it, every
    time; top.sls has only `base`), and the minion reloads its modules only when the sync
    brought any (the default reloads them all even when nothing changed)."""
    synced = master.cmd(minion_id, "saltutil.sync_modules",
                        kwarg={"saltenv": "base", "refresh": False}, timeout=60)
    if synced:
        master.cmd(minion_id, "saltutil.refresh_modules", timeout=60)
    return list(synced or [])


@task(name="prepare_vm_keys", task_run_name="prepare-vm-keys-{store.store_id}",
      retries=2, retry_delay_seconds=[2, 5], retry_condition_fn=retry_on(SaltTransientError))
def prepare_vm_keys(store: Store) -> dict[str, Any]:
    """Step 4: delete a stale key of the VM's minion id (exact id) and issue its one-time
    autosign token. A VM already running with an accepted key keeps it (rerun)."""
    logger = get_run_logger()
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    minion = store.vm_minion_id
    sync_hypervisor_modules(master, store.hypervisor_minion_id)
    # a key is stale only when its VM is going to be created anew; an existing domain (rerun,
    # or a VM that is merely down right now) keeps the key it was accepted with
    domain = master.cmd(store.hypervisor_minion_id, "storevirt.domain_summary", [store.vm_name])
    if domain is not None and master.key_state(minion) == "accepted":
        logger.info("store %s: VM %s exists and its key is accepted; keeping it",
                    store.store_id, minion)
        return {"minion": minion, "deleted_stale_key": False, "token_issued": False}
    deleted = master.delete_key(minion)
    master.issue_token(minion)
    logger.info("store %s: VM minion %s: stale key deleted: %s; one-time token issued",
                store.store_id, minion, deleted)
    return {"minion": minion, "deleted_stale_key": deleted, "token_issued": True}


@task(name="remove_vm_key", task_run_name="remove-vm-key-{store.store_id}")
def remove_vm_key(store: Store) -> dict[str, Any]:
    """Rollback: delete the VM's key (exact id) and revoke its autosign token."""
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    minion = store.vm_minion_id
    result = {"minion": minion, "key_deleted": master.delete_key(minion),
              "token_revoked": master.revoke_token(minion)}
    get_run_logger().info("store %s: VM key removal %s", store.store_id, result)
    return result
