"""The store-server VM on its hypervisor, through the hypervisor's Salt minion.

saltext-virt's `virt` module defines and starts the domain; the project's `storevirt` module
(salt_states/_modules) caches the base image, makes the qcow2 overlay and seeds the identity.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from store_rollout.inventory import Store
from store_rollout.settings import RolloutSettings, load_settings
from tasks.retry import retry_on
from tasks.salt_master import SaltCommandFailed, SaltTransientError, master_client


class VmError(Exception):
    """Creating or starting the store VM failed."""


class VmNotRunning(VmError):
    """virt.start returned but the domain is not running (yet): worth retrying."""


def interfaces_for(network: str) -> list[dict[str, Any]]:
    if network == "none":
        return []
    return [{"name": "eth0", "type": "bridge", "source": network, "model": "virtio"}]


def init_kwargs(store: Store, settings: RolloutSettings, disk_path: str) -> dict[str, Any]:
    """virt.init arguments: start=False, the overlay disk, serial console, VNC on localhost."""
    return {
        "start": False,
        "hypervisor": settings.vm_type,
        "seed": False,  # the identity comes from SMBIOS OEM strings, not guestfs
        "disk": None,
        "disks": [{"name": "system", "source_file": disk_path, "format": "qcow2",
                   "model": "virtio"}],
        "nic": None,
        "interfaces": interfaces_for(store.vm.network),
        "graphics": {"type": "vnc", "listen": {"type": "address", "address": "127.0.0.1"}},
        "serials": [{"type": "pty"}],
        "consoles": [{"type": "pty"}],
        "boot_dev": "hd",
    }


@task(name="create_vm", task_run_name="create-vm-{store.store_id}",
      retries=2, retry_delay_seconds=[3, 10], retry_condition_fn=retry_on(SaltTransientError))
def create_vm(store: Store, image: dict[str, Any], start_timeout: float = 120) -> dict[str, Any]:
    """Step 5: define the VM (virt.init, start=False) on an overlay of the base image, seed its
    identity, then virt.start with backoff until virt.vm_state says running. An existing
    domain on the same base image is reused, not recreated."""
    logger = get_run_logger()
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    hv, name, vm_minion = store.hypervisor_minion_id, store.vm_name, store.vm_minion_id
    summary = master.cmd(hv, "storevirt.domain_summary", [name])
    reused = summary is not None
    if summary is None:
        image_path = Path(image["path"])
        base = master.cmd(hv, "storevirt.ensure_base_image",
                          [f"file://{image_path}", image["key"]],
                          kwarg={"meta_source": f"file://{image_path.parent / 'meta.json'}"})
        overlay = master.cmd(hv, "storevirt.create_overlay", [name, base],
                             kwarg={"size_mib": store.vm.disk_gib * 1024})
        master.cmd(hv, "virt.init", [name, store.vm.vcpus, store.vm.memory_mib],
                   kwarg=init_kwargs(store, settings, overlay["path"]), timeout=180)
        summary = master.cmd(hv, "storevirt.domain_summary", [name])
        logger.info("store %s: domain %s defined on overlay %s", store.store_id, name,
                    overlay["path"])
    else:
        logger.info("store %s: domain %s exists; reusing it", store.store_id, name)
    if summary["identity"].get("minion_id") != vm_minion:
        # a fresh domain, or one whose creation was interrupted before its identity was seeded
        if summary["active"]:
            master.cmd(hv, "virt.stop", [name])
        master.cmd(hv, "storevirt.seed_identity",
                   [name, {"minion_id": vm_minion, "store_id": store.store_id,
                           "autosign_token": master.token_for(vm_minion) or ""}])
        summary = master.cmd(hv, "storevirt.domain_summary", [name])
    if summary["active"]:  # a rerun: already running, nothing to start
        logger.info("store %s: domain %s already running", store.store_id, name)
        return vm_result(summary, hv, reused)
    started = time.monotonic()
    for attempt in Retrying(stop=stop_after_delay(start_timeout),
                            wait=wait_exponential(multiplier=0.5, max=10),
                            retry=retry_if_exception_type((VmNotRunning, SaltTransientError)),
                            reraise=True):
        with attempt:
            state = master.cmd(hv, "virt.vm_state", [name]).get(name)
            if state != "running":
                try:
                    master.cmd(hv, "virt.start", [name])
                except SaltCommandFailed as exc:  # libvirt refused this start: retry it
                    logger.warning("store %s: virt.start %s failed: %s", store.store_id, name,
                                   exc.detail)
                    raise VmNotRunning(f"store {store.store_id}: virt.start {name} on {hv}: "
                                       f"{exc.detail}") from None
                state = master.cmd(hv, "virt.vm_state", [name]).get(name)
            if state != "running":
                raise VmNotRunning(f"store {store.store_id}: domain {name} on {hv} is {state!r}")
    logger.info("store %s: domain %s running (%.1fs to start)", store.store_id, name,
                time.monotonic() - started)
    return vm_result(summary, hv, reused)


def vm_result(summary: dict[str, Any], hypervisor: str, reused: bool) -> dict[str, Any]:
    return {"domain": summary["name"], "hypervisor": hypervisor, "reused": reused,
            "uuid": summary["uuid"], "disk": summary["disk"], "backing": summary["backing"],
            "graphics": summary["graphics"]}


@task(name="remove_vm", task_run_name="remove-vm-{store.store_id}",
      retries=2, retry_delay_seconds=[3, 10], retry_condition_fn=retry_on(SaltTransientError))
def remove_vm(store: Store) -> dict[str, Any]:
    """Rollback: destroy and undefine the store VM and delete its overlay disk."""
    settings = load_settings()
    master = master_client(settings.salt_master_config)
    removed = master.cmd(store.hypervisor_minion_id, "storevirt.remove_vm", [store.vm_name])
    get_run_logger().info("store %s: VM %s removed: %s", store.store_id, store.vm_name, removed)
    return dict(removed)
