"""One store as the real systems report it (tasks/observe.py gathers it, changing nothing)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from store_rollout import step_rules
from store_rollout.step_timeouts import STEP_TIMEOUTS

_BASE_KEY = re.compile(r"/base/(?P<key>[0-9a-f]{16,64})/image\.qcow2$")


class LastRun(BaseModel):
    """Prefect's newest store-rollout run of a store."""

    id: str
    name: str
    state: str  # the state's name: Completed, Failed, Crashed, Running, Scheduled...
    started: str | None = None
    # seconds since its last heartbeat (a Running run); None: none seen
    heartbeat_age: float | None = None


class StoreFacts(BaseModel):
    """One store as the real systems report it. None means "could not be read" where the
    field says so; every read is one batched call per kind (tasks/observe.py)."""

    store_id: str
    # the store's platform (store_rollout/platforms.py) and the OS its host reports (grains
    # osfullname and osrelease, e.g. "SLES 15.7"; None: not answering)
    platform: str = ""
    host_os: str | None = None
    hypervisor: str
    vm: str
    domain_name: str
    cobbler_system: str
    # image step: the key a rollout would use (the store's target version's), cached on the
    # orchestrator or to be built
    image_key: str
    image_cached: bool
    image_builder: str
    # image versions (store_rollout/fleet/versions.py): the version the store should run (the
    # inventory's, else the chain's; "" unversioned: not read from a system), the one its VM's
    # grain reports (None: not answering, or an image that reports none), and the one its
    # system disk's base image was built as (the image cache's meta.json of the domain's image
    # key; None: unknown)
    image_version: str = ""
    vm_image_version: str | None = None
    disk_image_version: str | None = None
    # Cobbler
    cobbler_record: bool
    cobbler_netboot: bool | None = None
    cobbler_changes: list[str] = Field(default_factory=list)  # described, secrets masked
    # when step 2 last powered the host on into its install (the record says), and whether
    # the host's BMC reports it on (asked only while that install may be underway; None: not
    # asked or no answer)
    power_cycled_at: datetime | None = None
    host_powered_on: bool | None = None
    # not read from a system: how long the rollout planned gives an install (its step 3's
    # timeout, the run's hypervisor_timeout), within which its step 2 leaves a host an earlier
    # run powered on into its install to that install
    install_seconds: float = STEP_TIMEOUTS.hypervisor_timeout
    # Salt: the hypervisor
    hypervisor_key: str | None = None  # accepted, pending, rejected, denied, None
    hypervisor_answering: bool = False
    hypervisor_ready: bool = False
    # the host's SMBIOS serial (None: none, or not answering) and the inventory's
    hypervisor_serial: str | None = None
    expected_serial: str | None = None
    highstate_changes: list[str] | None = None  # test=True; None: not checked
    highstate_note: str | None = None  # why it was not checked, or its error
    # libvirt, read through the hypervisor; None when the hypervisor did not answer
    base_image_on_hypervisor: bool | None = None
    domain: dict[str, Any] | None = None  # storevirt.domain_summary
    domain_known: bool = False  # the hypervisor answered: `domain` None means no domain
    # Salt: the VM
    vm_key: str | None = None
    vm_answering: bool = False
    firstboot_stage: str | None = None
    # ERP
    erp_notices: list[dict[str, Any]] = Field(default_factory=list)
    erp_error: str | None = None
    # Prefect (reconcile only)
    last_run: LastRun | None = None
    # backups (issue 48): configured (the settings' backup_url), the VM's newest snapshot on
    # the region's backup server {"id", "short_id", "time", "age_hours"} (None: none, or not
    # readable: backup_error), and the settings' bound reconcile flags an older one by
    backups_configured: bool = False
    last_backup: dict[str, Any] | None = None
    backup_error: str | None = None
    backup_max_age_hours: float = 48.0

    @property
    def installed(self) -> bool:
        """Step 2 would not install the host (unless a reinstall is asked for): installed by
        the durable facts, whether it answers now or not."""
        return step_rules.hypervisor_installed(
            self.hypervisor_key, step_rules.install_recorded(self.cobbler_record,
                                                             self.cobbler_netboot),
            self.hypervisor_ready)

    @property
    def silent(self) -> bool:
        """Installed, but not answering now: a rollout waits for it, never reinstalls it."""
        return self.installed and not self.hypervisor_answering

    @property
    def wrong_hardware(self) -> bool:
        """The answering host is not the store's box (step 3 would fail on it)."""
        return self.hypervisor_answering and not step_rules.hardware_matches(
            self.expected_serial, self.hypervisor_serial)

    @property
    def install_underway(self) -> bool:
        """Step 2 would leave the host to the install an earlier run powered it on into."""
        return step_rules.install_underway(self.power_cycled_at, datetime.now(UTC),
                                           self.install_seconds, bool(self.host_powered_on))

    @property
    def running(self) -> bool:
        """The domain exists and runs: step 5 would start nothing."""
        return not step_rules.start_needed(self.domain)

    @property
    def firstboot_done(self) -> bool:
        """Step 6 would find firstboot over (the VM answers with its last stage)."""
        return step_rules.firstboot_done(self.firstboot_stage if self.vm_answering else None)

    @property
    def domain_uuid(self) -> str | None:
        return None if self.domain is None else str(self.domain.get("uuid"))

    @property
    def disk_image_key(self) -> str | None:
        """The key of the base image the domain's system disk is backed by (the host says it,
        `image_key`, else its backing file's path does); None: no domain or not an overlay."""
        if self.domain is None:
            return None
        return str(self.domain.get("image_key") or "") or base_key_of(self.domain.get("backing"))

    @property
    def decommissioned(self) -> bool:
        """The ERP's newest notice of the store is its decommission."""
        return step_rules.decommissioned(self.erp_notices)

    def leftovers(self) -> list[str]:
        """What Cobbler, Salt and libvirt still hold of the store."""
        held = [(self.cobbler_record, f"Cobbler system {self.cobbler_system}"),
                (self.hypervisor_key, f"the key of {self.hypervisor} ({self.hypervisor_key})"),
                (self.vm_key, f"the key of {self.vm} ({self.vm_key})"),
                (self.domain is not None, f"domain {self.domain_name}")]
        return [what for there, what in held if there]

    def notice_for_vm(self) -> dict[str, Any] | None:
        """The ERP's notice for the VM that exists now (its uuid is in the idempotency key)."""
        return step_rules.erp_notice_for(self.erp_notices, self.domain_uuid)


def base_key_of(backing: str | None) -> str | None:
    """The image key of a VM disk's backing file (<images>/base/<key>/image.qcow2)."""
    match = _BASE_KEY.search(backing or "")
    return match.group("key") if match else None
