"""The store-server VM on its hypervisor, through the hypervisor's Salt minion.

saltext-virt's `virt` module defines and starts the domain (its arguments: tasks/vm_domain.py);
the project's `storevirt` module (salt_states/_modules) caches the base image, makes the qcow2
overlay and the data disk and writes the identity seed disk (an ISO the guest reads at boot,
ejected once firstboot is done).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.logging.loggers import LoggingAdapter

from store_rollout import step_rules
from store_rollout.guard import Action, Consent
from store_rollout.inventory import Store
from store_rollout.platforms import store_vm_type
from store_rollout.results import ImageRef
from store_rollout.settings_parts import CalendarSettings, HostSettings, ImageSettings, SaltSettings
from tasks.download_window import wait_for_download_window
from tasks.image_delivery import deliver_image
from tasks.retry import SALT_VIRT_RETRY
from tasks.salt import (
    SaltError,
    SaltTransientError,
    master_client,
)
from tasks.store_vm import StoreVm, VmError, start_domain
from tasks.vm_domain import init_kwargs
from tasks.windows import creation_window

log = logging.getLogger(__name__)


class HypervisorNotUp(VmError):
    """Staging needs the store's hypervisor installed and answering."""


@task(name="stage_image", task_run_name="stage-image-{store.store_id}")
def stage_image(store: Store, image: ImageRef, salt: SaltSettings,
                images: ImageSettings) -> dict[str, Any]:
    """Put the base image on the store's hypervisor ahead of its rollout window (verified, as
    step 5 would); the rollout's step 5 then finds it there and transfers nothing."""
    master = master_client(salt.salt_master_config)
    hv = store.hypervisor_minion_id
    try:
        master.cmd(hv, "test.ping", timeout=15)
    except SaltError:
        raise HypervisorNotUp(
            f"store {store.store_id}: hypervisor {hv} does not answer; staging needs an "
            f"installed host: roll the store out (`store-rollout rollout {store.store_id}`) or "
            "stage once its hypervisor is up") from None
    window = wait_for_download_window(store, images)
    delivered = deliver_image(master, store, images, image,
                              in_window=lambda: wait_for_download_window(store, images))
    get_run_logger().info("store %s: image %s staged on %s: %s bytes transferred",
                          store.store_id, image["key"], hv, delivered["transferred"])
    return {"store_id": store.store_id, "hypervisor": hv, "image_key": image["key"],
            "download_window": window, **delivered}


@task(name="create_vm", **SALT_VIRT_RETRY.on(SaltTransientError))
def create_vm(store: Store, image: ImageRef, start_timeout: float = 120,
              consent: Consent | None = None, window_covered: bool = False, *,
              salt: SaltSettings, hosts: HostSettings, images: ImageSettings,
              calendar: CalendarSettings) -> dict[str, Any]:
    """Step 5: define the VM (virt.init, start=False) on an overlay of the base image with its
    identity seed CD-ROM, write the seed, then virt.start with backoff until the domain runs
    (`start_domain`). An existing domain is reused, not recreated (step_rules.domain_reusable).
    Defining one disrupts the store: only in a maintenance window with `disruption_seconds`
    left (store_rollout/disruption.py), unless windows are overridden or step 2 of this run
    started the sequence in a window with room for this step too (`window_covered`: the host
    was installed by this run); outside one the step changes nothing and returns only
    `window` (go false, until when to wait). An existing domain is removed and defined anew
    (its minion's key deleted and a one-time token issued) only when `consent` asks for it
    (recreate_vm) and the guard (store_rollout/guard.py) lets it.

    Prefect retries (3 attempts) only on SaltTransientError: a minion that did not answer."""
    logger = get_run_logger()
    consent = consent or Consent()
    master = master_client(salt.salt_master_config)
    vm = StoreVm(master, store)
    summary = vm.summary()
    delivered, overridden, authorization = None, False, None
    if step_rules.domain_reusable(summary) and not consent.asks(Action.RECREATE_VM):
        logger.info("store %s: domain %s exists; reusing it", store.store_id, vm.name)
    else:  # a domain that exists (a working store server) is destroyed: the guard decides
        window, authorization = creation_window(summary is not None, store, consent, calendar,
                                                logger, window_covered)
        if not window["go"]:
            return {"window": window}
        summary, delivered = define_domain(vm, store, image, logger, replacing=summary,
                                           images=images, vm_type=store_vm_type(store, hosts))
        overridden = bool(window["overridden"])
    summary, settled = vm.settle(summary)
    if settled:
        logger.info("store %s: domain %s: %s", store.store_id, vm.name, "; ".join(settled))
    if not step_rules.start_needed(summary):  # a rerun: already running, nothing to start
        logger.info("store %s: domain %s already running", store.store_id, vm.name)
        return vm_result(summary, vm.hypervisor, delivered, overridden, authorization)
    started = time.monotonic()
    start_domain(master, store, start_timeout, logger=logger)
    logger.info("store %s: domain %s running (%.1fs to start)", store.store_id, vm.name,
                time.monotonic() - started)
    return vm_result(summary, vm.hypervisor, delivered, overridden, authorization)


def define_domain(vm: StoreVm, store: Store, image: ImageRef,
                  logger: logging.Logger | LoggingAdapter,
                  replacing: dict[str, Any] | None = None, *, images: ImageSettings,
                  vm_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base image on the hypervisor, the VM's disks and its domain defined (not started),
    in place of the domain `replacing` (removed first) if any; returns the domain's summary
    and how the image came."""
    if replacing is not None:
        logger.warning("store %s: recreating domain %s: %s", store.store_id, vm.name,
                       vm.remove_for_recreation(replacing))
    delivered = deliver_image(vm.master, store, images, image)
    logger.info("store %s: base image %s on %s: %s", store.store_id, image["key"],
                vm.hypervisor, delivery_note(delivered))
    disk, seed = vm.create_disks(delivered["path"])
    data = vm.create_data_disk()
    summary = vm.define(init_kwargs(store, vm_type, disk, seed, data["path"]))
    logger.info("store %s: domain %s defined on overlay %s, data disk %s (%s)", store.store_id,
                vm.name, disk, data["path"], "new" if data["created"] else "kept, as it was")
    return summary, delivered


def delivery_note(delivered: dict[str, Any]) -> str:
    """How the base image came to the hypervisor, for the log."""
    if delivered["cached"]:
        return "already there"
    resumed = delivered["resumed_from"]
    return (f"{delivered['transferred']} bytes in {delivered['seconds']}s"
            + (f" (resumed at {resumed})" if resumed else ""))


def vm_result(summary: dict[str, Any], hypervisor: str, delivered: dict[str, Any] | None,
              window_overridden: bool = False,
              authorization: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"domain": summary["name"], "hypervisor": hypervisor, "reused": delivered is None,
            "window_overridden": window_overridden, "authorization": authorization,
            # None for a reused domain; transferred 0 when the base was there (staged)
            "image_delivery": delivered,
            "uuid": summary["uuid"], "disk": summary["disk"], "backing": summary["backing"],
            "graphics": summary["graphics"]}
