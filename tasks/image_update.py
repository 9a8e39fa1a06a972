"""An image update of one store server (issue 47), on its hypervisor and its VM through the Salt
master: one thin task per change (the project's `storevirt` on the host: stage, shut down,
switch, revert, commit), per wait (the VM's minion back by its accepted key) and per check (the
update highstate, the version the VM reports). What to do and in which order is the flow's
(flows/image_update.py), what it decides store_rollout/updates.py's.

The host records a switch before it makes it (`storevirt.switch_system_disk` writes update.json
first): a rerun after a crash of the orchestrator reads that record (`read_update_state`), not
anyone's memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from prefect import get_run_logger, task
from prefect.runtime import flow_run

from store_rollout import step_rules
from store_rollout.contracts import (
    FIRSTBOOT_STAGE_DONE,
    FIRSTBOOT_STAGE_GRAIN,
    IMAGE_VERSION_GRAIN,
    UNVERSIONED_IMAGE,
)
from store_rollout.guard import Action, Consent
from store_rollout.inventory import Store
from store_rollout.results import ImageRef
from store_rollout.settings_parts import CalendarSettings, ErpSettings, ImageSettings, SaltSettings
from store_rollout.updates import StoreNotLive, not_live, without_data_disk
from tasks.download_window import wait_for_download_window
from tasks.erp import erp_client
from tasks.image_delivery import deliver_image
from tasks.retry import SALT_VIRT_RETRY, SALT_WAIT_RETRY
from tasks.salt import SaltError, SaltMasterClient, SaltTransientError, master_client
from tasks.salt.probes import PROBE_GATHER_TIMEOUT, PROBE_TIMEOUT, contested_key
from tasks.store_vm import start_domain
from tasks.windows import guarded_window

UPDATE_SLS: Final = "store_vm"  # what the new version needs of the role, not the firstboot
HIGHSTATE_TIMEOUT: Final = 900.0  # seconds the update highstate may take on the VM
START_TIMEOUT: Final = 120.0  # seconds virt.start may take to get the domain running
BACK_POLL_SECONDS: Final = 2.0  # how often the wait for the VM's minion asks again


class VmNotBack(RuntimeError):
    """The VM's minion did not answer with its accepted key within the bound."""


class UpdateCheckFailed(RuntimeError):
    """A check of the new version failed on the VM (the highstate, the version it reports)."""


def running_version(master: SaltMasterClient, minion: str) -> str | None:
    """The image version the VM's grain reports (an image from before versions: unversioned);
    None when the VM does not answer."""
    try:
        found = master.cmd(minion, "grains.get", [IMAGE_VERSION_GRAIN], timeout=PROBE_TIMEOUT,
                           gather_job_timeout=PROBE_GATHER_TIMEOUT)
    except SaltError:
        return None
    return str(found or UNVERSIONED_IMAGE)


@task(name="update_state", task_run_name="update-state-{store.store_id}",
      **SALT_WAIT_RETRY.on(SaltTransientError))
def read_update_state(store: Store, salt: SaltSettings, erp: ErpSettings) -> dict[str, Any]:
    """What the store's systems say: whether it is live (ERP), its domain (disk, base image
    key), the host's update record, the VM's key and running version. StoreNotLive (nothing
    changed) unless it is a live store."""
    live = step_rules.store_live(erp_client(erp).notices(store.store_id))
    master = master_client(salt.salt_master_config)
    hv, name, vm = store.hypervisor_minion_id, store.vm_name, store.vm_minion_id
    contested_key(master, store.store_id, vm, role="VM")
    domain = master.cmd(hv, "storevirt.domain_summary", [name])
    record = master.cmd(hv, "storevirt.update_record", [name]) if domain else None
    state = {"domain": domain, "record": record, "key": master.key_state(vm),
             "running_version": running_version(master, vm)}
    problem = not_live(live, domain, state["key"], state["running_version"], record)
    if problem:
        raise StoreNotLive(f"store {store.store_id}: no live store to update or revert: "
                           f"{problem}; nothing changed (roll it out: `store-rollout rollout "
                           f"{store.store_id}`)")
    lacking = without_data_disk(store.store_id, domain)
    if lacking:
        raise StoreNotLive(lacking)
    get_run_logger().info("store %s: runs version %s on image %s; update record: %s",
                          store.store_id, state["running_version"],
                          str(domain.get("image_key"))[:12], record or "none")
    return state


@task(name="stage_update", task_run_name="stage-update-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def stage_update(store: Store, image: ImageRef, salt: SaltSettings,
                 images: ImageSettings) -> dict[str, Any]:
    """Ahead of the window: the new base image on the host (verified, as staging does) and a
    fresh system disk on it beside the current one; the running VM is not touched."""
    master = master_client(salt.salt_master_config)
    domain = master.cmd(store.hypervisor_minion_id, "storevirt.domain_summary", [store.vm_name])
    wait_for_download_window(store, images)  # bytes over the link only in the download window
    # (deliver_image asks it again before each resume of a cut download)
    # the base it runs on: the host fetches only what changed from it when it holds it
    delivered = deliver_image(master, store, images, image,
                              old_key=(domain or {}).get("image_key"),
                              in_window=lambda: wait_for_download_window(store, images))
    staged = master.cmd(store.hypervisor_minion_id, "storevirt.stage_system_disk",
                        [store.vm_name, delivered["path"]])
    get_run_logger().info("store %s: image %s on %s (%s bytes transferred), new system disk %s",
                          store.store_id, image["key"][:12], store.hypervisor_minion_id,
                          delivered["transferred"], staged["path"])
    get_run_logger().info("store %s: image delivered as %s (%s of %s bytes)", store.store_id,
                          delivered.get("mode"), delivered["transferred"],
                          delivered.get("full_size"))
    return {"base": delivered["path"], "disk": staged["path"], "image_key": image["key"],
            "transferred": delivered["transferred"], "mode": delivered.get("mode"),
            "full_size": delivered.get("full_size")}


def update_window(action: Action, store: Store, consent: Consent,
                  calendar: CalendarSettings) -> dict[str, Any]:
    """The guard's decision on an update or revert now (tasks/windows.run_in_window waits for
    the window it names): {"window", "authorization"}; ActionRefused when not asked for or
    not approved."""
    window, record = guarded_window(action, store, consent, calendar, get_run_logger())
    return {"window": window, "authorization": record}


@task(name="shutdown_vm", task_run_name="shutdown-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def shutdown_vm(store: Store, salt: SaltSettings, timeout: float) -> dict[str, Any]:
    """The store server shut down through its OS (ACPI), cut off after `timeout` seconds."""
    done: dict[str, Any] = master_client(salt.salt_master_config).cmd(
        store.hypervisor_minion_id, "storevirt.shutdown", [store.vm_name],
        kwarg={"timeout": timeout}, timeout=timeout + 60)
    log = get_run_logger()
    (log.info if done.get("clean", True) else log.warning)(
        "store %s: %s %s in %ss", store.store_id, store.vm_name,
        "shut down" if done.get("clean", True) else "did not shut down in time: cut off",
        done.get("seconds"))
    return done


@task(name="switch_disk", task_run_name="switch-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def switch_disk(store: Store, salt: SaltSettings, disk: str, version: str) -> dict[str, Any]:
    """The stopped domain's system disk switched to `disk` (the host records it first)."""
    summary: dict[str, Any] = master_client(salt.salt_master_config).cmd(
        store.hypervisor_minion_id, "storevirt.switch_system_disk", [store.vm_name, disk],
        kwarg={"version": version, "run": str(flow_run.id or "")})
    get_run_logger().warning("store %s: %s switched to system disk %s (version %s)",
                             store.store_id, store.vm_name, disk, version)
    return summary


@task(name="boot_vm", task_run_name="boot-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def boot_vm(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """The domain started (step 5's start loop) on whichever system disk it has now."""
    master = master_client(salt.salt_master_config)
    start_domain(master, store, START_TIMEOUT, logger=get_run_logger())
    summary: dict[str, Any] = master.cmd(store.hypervisor_minion_id, "storevirt.domain_summary",
                                         [store.vm_name])
    return summary


def minion_back(master: SaltMasterClient, store: Store, timeout: float,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> float:
    """Seconds until the VM's minion answers with its accepted key (a second key for its id
    fails at once: MinionKeyContested); VmNotBack after `timeout`."""
    started, minion = clock(), store.vm_minion_id
    while True:
        contested_key(master, store.store_id, minion, role="VM")
        if master.key_state(minion) == "accepted" and master.ping(minion):
            return round(clock() - started, 3)
        if clock() - started >= timeout:
            raise VmNotBack(f"store {store.store_id}: the VM's minion {minion} did not answer "
                            f"with its accepted key within {timeout:.0f} s of its boot")
        sleep(BACK_POLL_SECONDS)


@task(name="wait_vm_back", task_run_name="vm-back-{store.store_id}")
def wait_vm_back(store: Store, salt: SaltSettings, timeout: float) -> dict[str, Any]:
    """The VM's minion answering again (same id, same key) after its boot; VmNotBack after
    `timeout` seconds (not retried: the bound is the parameter)."""
    seconds = minion_back(master_client(salt.salt_master_config), store, timeout)
    get_run_logger().info("store %s: %s answers again, %.1f s after its boot", store.store_id,
                          store.vm_minion_id, seconds)
    return {"minion": store.vm_minion_id, "seconds": seconds}


@task(name="update_highstate", task_run_name="update-highstate-{store.store_id}")
def update_highstate(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """What the new version needs of the store server's role (`state.apply store_vm`), not the
    firstboot; the project's custom modules synced first (a new system disk has none: they
    live in the minion's cache on it). UpdateCheckFailed naming what failed."""
    master = master_client(salt.salt_master_config)
    try:
        master.cmd(store.vm_minion_id, "saltutil.sync_all", timeout=HIGHSTATE_TIMEOUT)
        states = master.cmd(store.vm_minion_id, "state.apply", [UPDATE_SLS],
                            timeout=HIGHSTATE_TIMEOUT)
        # the grain lived on the old system disk: without it a rollout's rerun would wait in
        # step 6 for a firstboot this provisioned store never runs again
        master.cmd(store.vm_minion_id, "grains.setval",
                   [FIRSTBOOT_STAGE_GRAIN, FIRSTBOOT_STAGE_DONE])
    except SaltError as exc:
        raise UpdateCheckFailed(f"store {store.store_id}: saltutil.sync_all and state.apply "
                                f"{UPDATE_SLS} on {store.vm_minion_id}: {exc}") from None
    count = len(states) if isinstance(states, dict) else 0
    get_run_logger().info("store %s: state.apply %s: %d states, all passed", store.store_id,
                          UPDATE_SLS, count)
    return {"sls": UPDATE_SLS, "states": count}


@task(name="check_version", task_run_name="version-{store.store_id}",
      **SALT_WAIT_RETRY.on(SaltTransientError))
def check_version(store: Store, salt: SaltSettings, version: str) -> dict[str, Any]:
    """The VM itself says it runs `version` (its grain, baked into the image)."""
    reported = running_version(master_client(salt.salt_master_config), store.vm_minion_id)
    if reported != version:
        raise UpdateCheckFailed(f"store {store.store_id}: {store.vm_minion_id} reports image "
                                f"version {reported or 'nothing (no answer)'}, not {version}")
    return {"version": reported}


@task(name="commit_update", task_run_name="commit-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def commit_update(store: Store, salt: SaltSettings, keep_hours: float) -> dict[str, Any]:
    """The new system disk is the store's; the previous one kept `keep_hours` for a manual
    revert, older ones (and reverted attempts) deleted."""
    master = master_client(salt.salt_master_config)
    hv, name = store.hypervisor_minion_id, store.vm_name
    record: dict[str, Any] = master.cmd(hv, "storevirt.commit_update", [name, keep_hours])
    pruned = master.cmd(hv, "storevirt.prune_system_disks", [name])
    get_run_logger().info("store %s: update committed; previous system disk %s kept until %s; "
                          "deleted: %s", store.store_id, record.get("from"),
                          time.strftime("%Y-%m-%d %H:%M UTC",
                                        time.gmtime(float(record.get("keep_until") or 0))),
                          pruned or "none")
    return {"record": record, "pruned": pruned}


@task(name="revert_disk", task_run_name="revert-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def revert_disk(store: Store, salt: SaltSettings, shutdown_timeout: float) -> dict[str, Any]:
    """The VM shut down (cut off after `shutdown_timeout`) and its domain back on the record's
    previous system disk (the record says reverted)."""
    master = master_client(salt.salt_master_config)
    hv, name = store.hypervisor_minion_id, store.vm_name
    stopped = master.cmd(hv, "storevirt.shutdown", [name], kwarg={"timeout": shutdown_timeout},
                         timeout=shutdown_timeout + 60)
    summary: dict[str, Any] = master.cmd(hv, "storevirt.revert_system_disk", [name])
    get_run_logger().warning("store %s: %s back on its previous system disk %s",
                             store.store_id, name, summary.get("disk"))
    return {"shutdown": stopped, "domain": summary}
