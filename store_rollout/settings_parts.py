"""The part of the settings each outside system's tasks use, carried to them by the flow.

A process entry (a flow, a CLI command, a bench) calls `load_settings()` once
(store_rollout/settings.py, where the precedence of the sources is written down) and hands each
task the typed part it uses: `SaltSettings.of(settings)`. A task never loads settings itself, so
it validates and depends on nothing it does not use: step 3 talks to Salt only, and a bad ERP
URL cannot fail it (tests/unit/store_rollout/test_settings_parts.py). Secrets are never part of one:
a part names the Prefect Block that holds them, and the client reads the Block when it is built.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from store_rollout.data_disk import DEFAULT_DATA_EXPORT_DIR
from store_rollout.image_versions import ImageVersion
from store_rollout.inventory.calendar_spec import CalendarSpec

__all__ = ["ApprovalSettings", "BmcSettings", "CalendarSettings", "CobblerSettings",
           "ErpSettings", "HostSettings", "ImageSettings", "SaltSettings", "SettingsParts"]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, settings: Any) -> Self:
        """This part of loaded settings (a RolloutSettings; already validated as a whole)."""
        return cls.model_validate({name: getattr(settings, name) for name in cls.model_fields})


class SaltSettings(_Part):
    """The region's Salt master: steps 3 to 7, keys, probes."""
    salt_master_config: str
    salt_master_address: str
    salt_publish_port: int = 4505
    salt_ret_port: int = 4506
    go_live_settle_seconds: float = 120.0
    # how long steps 6 and 7 wait for a store whose link went silent (tasks/store_link.py)
    store_link_wait_seconds: float = 3600.0
    # the worker beside the master keeps a decommission's data disk export here
    data_export_dir: str = DEFAULT_DATA_EXPORT_DIR


class CobblerSettings(_Part):
    """The region's Cobbler: step 2's record, netboot, syncs (tasks/cobbler/)."""
    cobbler_url: str = ""
    cobbler_user: str = ""
    cobbler_password_block: str = ""
    cobbler_credentials_block: str = ""
    cobbler_allow_default_credentials: bool = False
    cobbler_ca_bundle: str = ""
    insecure_cobbler_http: bool = False
    cobbler_sync_limit: str


class BmcSettings(_Part):
    """The store hosts' BMCs (tasks/bmc/): protocol, login Block, power timings."""
    bmc_credentials_block: str = ""
    power_type: Literal["ipmi", "redfish"] = "ipmi"
    redfish_ca_bundle: str = ""
    insecure_redfish_http: bool = False
    power_off_seconds: float = 5.0
    graceful_shutdown_seconds: float = 300.0


class HostSettings(_Part):
    """What a store host is installed with and runs (step 2's profile, step 5's domain)."""
    hypervisor_platform: str = ""
    hypervisor_libvirt_uri: str = ""
    vm_type: Literal["", "xen", "kvm", "qemu"] = ""
    vm_images_dir: str
    hypervisor_update_repos: list[str] | None = None
    sle16_product: str = "sles"
    registration_url: str = ""
    registration_code_block: str = ""
    hypervisor_ready_expected_seconds: float


class ImageSettings(_Part):
    """The store server's image: its KIWI build (step 1) and its delivery to the hosts."""
    image_description: str
    image_builder: str = "kiwi"  # a registered builder (store_rollout/plugins.py)
    image_cache_dir: str
    image_params: dict[str, str]
    image_base_url: str
    image_ca_bundle: str = ""
    image_rate_limit: int = 0
    image_versions: dict[str, ImageVersion] = Field(default_factory=dict)
    image_version: str = ""
    image_keep_previous_hours: float = 168.0
    # staging's own window (issue 49, tasks/download_window.py), in the store's time zone
    download_window: list[str] | None = None
    default_time_zone: str = ""


class ErpSettings(_Part):
    """The ERP (tasks/erp.py): its URL and token Block, or one Credentials Block."""
    erp_url: str = ""
    erp_token_block: str = ""
    erp_credentials_block: str = ""
    erp_timeout_seconds: float = 15.0
    erp_ca_bundle: str = ""
    insecure_erp_http: bool = False


class CalendarSettings(_Part):
    """When disruptive steps may run: the chain's default calendar and each step's length."""
    default_calendar: CalendarSpec | None
    disruption_seconds: dict[str, float]


class ApprovalSettings(_Part):
    """Who may approve (their seeds' Block) and where the audit trail is kept."""
    approval_policy: str
    approval_timeout_seconds: float
    approvers_block: str
    audit_dir: str


class SettingsParts(BaseModel):
    """Every part, cut once from loaded settings by a flow that hands them to its tasks."""
    model_config = ConfigDict(frozen=True)

    salt: SaltSettings
    cobbler: CobblerSettings
    power: BmcSettings
    hosts: HostSettings
    images: ImageSettings
    erp: ErpSettings
    calendar: CalendarSettings
    approvals: ApprovalSettings

    @classmethod
    def of(cls, settings: Any) -> SettingsParts:
        return cls(salt=SaltSettings.of(settings), cobbler=CobblerSettings.of(settings),
                   power=BmcSettings.of(settings), hosts=HostSettings.of(settings),
                   images=ImageSettings.of(settings), erp=ErpSettings.of(settings),
                   calendar=CalendarSettings.of(settings), approvals=ApprovalSettings.of(settings))
