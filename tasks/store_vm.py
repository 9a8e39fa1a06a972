"""The store VM's libvirt domain on its hypervisor, through the hypervisor's Salt minion: one
method per change step 5 makes (saltext-virt's `virt`, the project's `storevirt`), and the start
loop step 5 and an image update's boots share (`start_domain`).

Which of them a run needs is store_rollout/step_rules.py's to say, the rules plan and reconcile
predict with; this client only carries them out.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.logging.loggers import LoggingAdapter
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from store_rollout import step_rules
from store_rollout.inventory import Store
from tasks.salt import SaltCommandFailed, SaltMasterClient
from tasks.salt.probes import contested_key

log = logging.getLogger(__name__)

DEFINE_TIMEOUT = 180  # seconds virt.init may take (it writes the domain's XML and disks)


class VmError(Exception):
    """Creating or starting the store VM failed."""


class VmNotRunning(VmError):
    """virt.start returned but the domain is not running (yet): worth retrying."""


class DomainVanished(Exception):
    """The domain this step just defined or seeded is not on its hypervisor (not retried)."""


class StoreVm:
    """One store's domain: `summary()` is storevirt.domain_summary (None: no domain)."""

    def __init__(self, master: SaltMasterClient, store: Store) -> None:
        self.master, self.store = master, store
        self.hypervisor, self.name = store.hypervisor_minion_id, store.vm_name

    def summary(self) -> dict[str, Any] | None:
        """Fails first when two keys claim the VM's id (an intruder signed in as this store's
        server: nothing is defined, started or seeded for either)."""
        contested_key(self.master, self.store.store_id, self.store.vm_minion_id, role="VM")
        # by name: virt.vm_state enumerates every domain of the host and fails when another
        # one goes away meanwhile
        summary: dict[str, Any] | None = self.master.cmd(
            self.hypervisor, "storevirt.domain_summary", [self.name])
        return summary

    def create_disks(self, base_path: str) -> tuple[str, str]:
        """(overlay disk, seed ISO path) of a new domain, the overlay on `base_path`."""
        overlay = self.master.cmd(self.hypervisor, "storevirt.create_overlay",
                                  [self.name, base_path],
                                  kwarg={"size_mib": self.store.vm.disk_gib * 1024})
        seed = self.master.cmd(self.hypervisor, "storevirt.seed_path", [self.name])
        return str(overlay["path"]), str(seed)

    def create_data_disk(self) -> dict[str, Any]:
        """The VM's data disk ({"path", "created"}): made once (vm.data_disk_gib), an existing
        one kept as it is (storevirt.create_data_disk never reformats nor resizes it)."""
        made: dict[str, Any] = self.master.cmd(self.hypervisor, "storevirt.create_data_disk",
                                               [self.name, self.store.vm.data_disk_gib])
        return made

    def define(self, init_kwargs: dict[str, Any]) -> dict[str, Any]:
        """virt.init with these arguments (start=False); the new domain's summary."""
        vm = self.store.vm
        self.master.cmd(self.hypervisor, "virt.init", [self.name, vm.vcpus, vm.memory_mib],
                        kwarg=init_kwargs, timeout=DEFINE_TIMEOUT)
        return self._defined()

    def settle(self, summary: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The identity seed written (step_rules.seed_needed) and autostart on; returns the
        summary after them and what was done."""
        done = []
        if step_rules.seed_needed(summary, self.store.vm_minion_id):
            summary = self.seed_identity(summary)
            done.append("identity seeded")
        if not summary.get("autostart"):
            # the store comes back by itself after a power cut: the host's libvirt starts it
            # at boot (Salt 3006's virt.init has no autostart argument; storevirt's works by
            # name, unlike virt.set_autostart)
            self.master.cmd(self.hypervisor, "storevirt.set_autostart", [self.name])
            done.append(f"marked autostart on {self.hypervisor}")
        return summary, done

    def remove_for_recreation(self, summary: dict[str, Any]) -> str:
        """The domain (and its system disk) removed, its data disk kept (storevirt.remove_vm's
        default), its minion's key deleted and a one-time token
        issued for the new one: step 4's work for a VM created anew, done only once the old
        VM's minion is gone (a key deleted while it runs would come back pending)."""
        self.master.cmd(self.hypervisor, "storevirt.remove_vm", [self.name])
        minion = self.store.vm_minion_id
        deleted = self.master.delete_key(minion)
        self.master.issue_token(minion)
        return (f"uuid {summary.get('uuid')} removed with its disk {summary.get('disk')}; key "
                f"of {minion} deleted: {deleted}; one-time token issued")

    def seed_identity(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the seed the guest reads its identity from (the domain stopped first: the
        guest reads it at boot); the summary after it."""
        if summary["active"]:
            self.master.cmd(self.hypervisor, "storevirt.stop", [self.name])
        minion = self.store.vm_minion_id
        self.master.cmd(self.hypervisor, "storevirt.seed_identity",
                        [self.name, {"minion_id": minion, "store_id": self.store.store_id,
                                     "autosign_token": self.master.token_for(minion) or ""}])
        return self._defined()

    def _defined(self) -> dict[str, Any]:
        summary = self.summary()
        if summary is None:
            raise DomainVanished(f"store {self.store.store_id}: domain {self.name} is gone from "
                               f"{self.hypervisor} right after it was defined")
        return summary


def start_domain(master: SaltMasterClient, store: Store, timeout: float,
                 backoff: float = 0.5, logger: logging.Logger | LoggingAdapter = log) -> None:
    """virt.start until the domain is running (storevirt.domain_summary), for up to `timeout`
    seconds (exponential backoff from `backoff` s, at most 10 s apart).

    The one retry layer for a start libvirt refuses or a domain not running yet (VmNotRunning),
    which the task's Prefect retries do not retry. A minion that does not answer
    (SaltTransientError) is not retried here: it ends the attempt, and create_vm's Prefect retries
    (which reuse the defined domain) are that error's one layer."""
    hv, name = store.hypervisor_minion_id, store.vm_name

    def running() -> bool:
        # by name: virt.vm_state enumerates every domain of the host and fails when another
        # one goes away meanwhile ("Domain not found: no domain with matching id")
        summary = master.cmd(hv, "storevirt.domain_summary", [name])
        if summary is None:
            raise VmError(f"store {store.store_id}: domain {name} is gone from {hv}")
        return bool(summary["active"])

    for attempt in Retrying(stop=stop_after_delay(timeout),
                            wait=wait_exponential(multiplier=backoff, max=10),
                            retry=retry_if_exception_type(VmNotRunning), reraise=True):
        with attempt:
            if not running():
                try:
                    master.cmd(hv, "virt.start", [name])
                except SaltCommandFailed as exc:  # libvirt refused this start: retry it
                    logger.warning("store %s: virt.start %s failed: %s", store.store_id, name,
                                   exc.detail)
                    raise VmNotRunning(f"store {store.store_id}: virt.start {name} on {hv}: "
                                       f"{exc.detail}") from None
                if not running():
                    raise VmNotRunning(f"store {store.store_id}: domain {name} on {hv} is not "
                                       "running after virt.start")
