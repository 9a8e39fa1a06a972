"""Following the store VM through `provisioning_helper.firstboot` on the master's event bus.

The VM runs firstboot by itself (startup_states from the image's bootstrap minion.d file); this
task only watches: stage events `store/vm/firstboot/{started,highstate,report,done}` from the
VM's minion, its (re)starts, and the returns of its state runs, failing fast with the failing
states' ids and comments.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task

from store_rollout.contracts import (
    FIRSTBOOT_EVENT_DONE,
    FIRSTBOOT_EVENT_PREFIX,
    FIRSTBOOT_STAGE_DONE,
    FIRSTBOOT_STAGE_GRAIN,
    FIRSTBOOT_STAGE_NEW,
)
from store_rollout.inventory import Store
from store_rollout.settings import RolloutSettings, load_settings
from tasks.retry import retry_on
from tasks.salt_client import (
    SaltError,
    SaltEvent,
    SaltEventTimeout,
    SaltMasterClient,
    SaltTransientError,
    failed_states,
    master_client,
)

STATE_FUNS = {"state.sls", "state.apply", "state.highstate"}


class FirstbootFailed(Exception):
    """A firstboot state run on the VM failed; carries the failing states."""

    def __init__(self, store_id: str, minion: str, states: list[dict[str, str]], raw: str) -> None:
        detail = "; ".join(f"{s['id']}: {s['comment']}" for s in states) or raw
        super().__init__(f"store {store_id}: firstboot on {minion} failed: {detail}")
        self.states = states


def current_stage(master: SaltMasterClient, minion: str) -> str | None:
    """The VM's firstboot_stage grain, or None when it does not answer."""
    try:
        stage = master.cmd(minion, "grains.get", [FIRSTBOOT_STAGE_GRAIN], timeout=5)
        return str(stage or FIRSTBOOT_STAGE_NEW)
    except SaltError:
        return None


class VmNeverContacted(Exception):
    """The VM's minion never reached the master: not transient, a retry would wait again."""


def never_contacted(store: Store, settings: RolloutSettings, waited: float) -> str:
    """What a technician needs when the VM's minion never showed up at the master."""
    master_address = settings.image_params.get("SALT_MASTER", settings.salt_master_address)
    master_port = settings.image_params.get("SALT_MASTER_PORT", str(settings.salt_ret_port))
    return (f"store {store.store_id}: VM minion {store.vm_minion_id} never contacted the master "
            f"within {waited:.0f}s of step 6 (awaited its key and its "
            f"salt/minion/{store.vm_minion_id}/start event; neither came). The guest did not "
            f"boot or cannot reach the master at {master_address}:{master_port}, the address "
            "its image was built with (image_params SALT_MASTER/SALT_MASTER_PORT): check the "
            f"VM's console (`virsh console {store.vm_name}` on {store.hypervisor_minion_id}) "
            "and its /etc/salt/minion.d/00-master.conf")


def reset_vm(master: SaltMasterClient, store: Store) -> None:
    """Hard reset of a VM that stopped answering (a hung guest): stop, then start the domain."""
    hv, name = store.hypervisor_minion_id, store.vm_name
    master.cmd(hv, "virt.stop", [name])
    master.cmd(hv, "virt.start", [name])


@task(name="firstboot", task_run_name="firstboot-{store.store_id}",
      retries=1, retry_delay_seconds=5, retry_condition_fn=retry_on(SaltTransientError))
def firstboot(store: Store, timeout: float = 900, stall_timeout: float = 300,
              contact_timeout: float = 600) -> dict[str, Any]:
    """Step 6: reboot, highstate, report, reboot and verify, bootstrap config removed, then
    the identity seed ejected from the VM and deleted on the hypervisor.

    Judged by the VM itself: its `firstboot_stage` grain is checked after subscribing and after
    every (re)start of its minion. A VM whose accepted minion stays silent for `stall_timeout`
    (hung after a reboot) is reset once per attempt. A VM whose minion never contacts the
    master (no key, no event) within `contact_timeout` fails the step at once, naming the
    master address the image was built with: no wait for the whole `timeout`.

    The result has the time of each stage event and each minion start (seconds into the step)
    and the kernel's boot id each stage ran under: two reboots show as three boot ids.
    """
    logger = get_run_logger()
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    minion = store.vm_minion_id
    started = time.monotonic()
    stages: dict[str, float] = {}
    boot_ids: dict[str, str] = {}
    minion_starts: list[float] = []
    boots = 0
    last: dict[str, SaltEvent] = {}
    token_revoked = False
    resets = 0

    def revoke_once() -> None:
        nonlocal token_revoked
        if not token_revoked and master.key_state(minion) == "accepted":
            token_revoked = master.revoke_token(minion) or True

    def relevant(event: SaltEvent) -> bool:
        nonlocal boots
        if event.minion != minion and not event.tag.startswith(f"salt/minion/{minion}/"):
            return False
        last["event"] = event
        last_seen["at"] = time.monotonic()
        if event.tag == f"salt/minion/{minion}/start":
            boots += 1
            minion_starts.append(round(time.monotonic() - started, 3))
            revoke_once()
            return current_stage(master, minion) == FIRSTBOOT_STAGE_DONE
        if event.tag.startswith(FIRSTBOOT_EVENT_PREFIX):
            stage = event.tag[len(FIRSTBOOT_EVENT_PREFIX):]
            stages[stage] = round(time.monotonic() - started, 3)
            if event.payload.get("boot_id"):
                boot_ids[stage] = str(event.payload["boot_id"])
            logger.info("store %s: firstboot stage %s", store.store_id, stage)
            return stage == FIRSTBOOT_EVENT_DONE
        if (event.tag.startswith("salt/job/") and event.data.get("fun") in STATE_FUNS
                and int(event.data.get("retcode", 0) or 0) != 0):
            ret = event.data.get("return")
            raise FirstbootFailed(store.store_id, minion, failed_states(ret), str(ret)[:500])
        return False

    last_seen = {"at": time.monotonic()}
    deadline = started + timeout
    with master.subscribe("") as bus:
        revoke_once()
        done = current_stage(master, minion) == FIRSTBOOT_STAGE_DONE
        contacted = done or master.key_state(minion) is not None
        while not done:
            contacted = contacted or bool(last)
            if (not contacted and time.monotonic() - started > contact_timeout
                    and master.key_state(minion) is None):
                raise VmNeverContacted(never_contacted(store, settings, contact_timeout))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last_event = last.get("event")
                raise SaltEventTimeout(
                    f"store {store.store_id}: VM minion {minion} did not finish firstboot "
                    f"within {timeout:.0f}s; stages seen: {list(stages) or 'none'}; last "
                    f"event from it: {last_event.tag if last_event else 'none'}; resets: {resets}")
            try:
                master.wait_for_event(bus, relevant, timeout=min(remaining, 5), what="firstboot")
                done = True
            except SaltEventTimeout:
                silent = time.monotonic() - last_seen["at"]
                if (silent > stall_timeout and resets == 0
                        and master.key_state(minion) == "accepted"
                        and current_stage(master, minion) is None):
                    logger.warning("store %s: VM minion %s silent for %.0fs; resetting the VM",
                                   store.store_id, minion, silent)
                    reset_vm(master, store)
                    resets += 1
                    last_seen["at"] = time.monotonic()
    revoke_once()
    leftovers = [p for p in master.cmd(minion, "provisioning.bootstrap_files")
                 if master.cmd(minion, "file.file_exists", [p])]
    if leftovers:
        raise FirstbootFailed(store.store_id, minion, [], f"bootstrap files left: {leftovers}")
    # the hypervisor's half of the bootstrap data: the seed disk with the one-time token
    seed = master.cmd(store.hypervisor_minion_id, "storevirt.retire_seed", [store.vm_name])
    logger.info("store %s: identity seed %s ejected and deleted", store.store_id, seed["seed"])
    logger.info("store %s: firstboot done in %.1fs", store.store_id, time.monotonic() - started)
    return {"minion": minion, "stages": stages, "boot_ids": boot_ids,
            "minion_starts": minion_starts, "boots_seen": boots, "resets": resets,
            "seed_retired": seed["state"] == "retired",
            "seconds": round(time.monotonic() - started, 3)}
