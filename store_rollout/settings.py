"""Where the rollout's outside systems are, and their credentials.

Loaded once per process entry (a flow, a CLI command, a bench) by `load_settings()`, which
validates all of them; each task then gets the typed part it uses
(store_rollout/settings_parts.py), never loads them itself. Where a value comes from, the first
that gives it wins:
1. a Credentials Block the settings name (a service's URL, user and secret; read by the
   client's builder when a task builds it, tasks/cobbler/, tasks/erp.py, tasks/bmc/);
2. the regions file's settings of this process's region (store_rollout/regions.py);
3. the environment, `STORE_ROLLOUT_<FIELD>`;
4. the dotenv file STORE_ROLLOUT_SETTINGS_FILE names (the same variables, one per line; the
   local lab writes one; mode 600, or it is refused; only ever read when named);
5. the field's default below.

Secrets live in Prefect Blocks only (store_rollout/settings_guard.py refuses one given here):
the settings name them, a Credentials Block (tasks/cobbler/, tasks/erp.py,
`STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK`...; with one named the service's URL and user are no
longer required) or a Secret block of the one secret (`STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK`,
`STORE_ROLLOUT_ERP_TOKEN_BLOCK`); loading them is the tasks' business.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from store_rollout.data_disk import DEFAULT_DATA_EXPORT_DIR
from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS, checked_disruptions
from store_rollout.image_versions import ImageVersion, checked_versions, known
from store_rollout.plugins import known_builder
from store_rollout.regions import (
    DEFAULT_COBBLER_SYNC_LIMIT,
    DEFAULT_REGION,
    REGION_RE,
    Regions,
    load_regions,
)
from store_rollout.settings_approvers import ApproverSettings
from store_rollout.settings_backup import BackupSettings
from store_rollout.settings_guard import SettingsError, refuse_unsafe, region_settings
from store_rollout.settings_link import LinkSettings
from store_rollout.settings_refresh import RefreshSettings
from store_rollout.settings_transport import TransportSettings
from store_rollout.step_timeouts import READY_EXPECTED_SECONDS
from store_rollout.update_repos import checked_repo_urls, repo_list

SETTINGS_FILE_ENV = "STORE_ROLLOUT_SETTINGS_FILE"
__all__ = ["SETTINGS_FILE_ENV", "RolloutSettings", "SettingsError", "load_settings",
           "settings_file"]
# a named credentials Block replaces these fields; without one they are required
BLOCK_REPLACES = {"cobbler_credentials_block": ("cobbler_url", "cobbler_user",
                                                "cobbler_password_block"),
                  "erp_credentials_block": ("erp_url", "erp_token_block")}
_REPLACED_BY = {name: block for block, names in BLOCK_REPLACES.items() for name in names}


class RolloutSettings(TransportSettings, ApproverSettings, RefreshSettings, BackupSettings,
                      LinkSettings):
    model_config = SettingsConfigDict(env_prefix="STORE_ROLLOUT_", extra="ignore", frozen=True)

    # declared before the fields they replace: _required_without_block reads them
    cobbler_credentials_block: str = Field("", description="name of a Cobbler Credentials Block")
    erp_credentials_block: str = Field("", description="name of an ERP Credentials Block")
    bmc_credentials_block: str = Field("", description="name of a BMC Credentials Block")
    # the Prefect notification block (webhook, mail, chat) the automations send through
    # (tasks/notifications.py; `prefect-setup` creates them); empty: no notifications
    notification_block: str = Field(
        "", description="a Prefect notification block, <block type>/<name>, e.g. slack-webhook/ops")
    cobbler_url: str = Field("", validate_default=True,
                             description="Cobbler XML-RPC URL, e.g. http://cobbler:25151/")
    cobbler_user: str = Field("", validate_default=True)
    cobbler_password_block: str = Field("", validate_default=True,
                                        description="Prefect Secret block of Cobbler's password")
    cobbler_allow_default_credentials: bool = False
    # Cobbler syncs never overlap on one Cobbler: a region with its own names its own limit
    cobbler_sync_limit: str = Field(DEFAULT_COBBLER_SYNC_LIMIT, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
                                    description="the Prefect global concurrency limit (1 slot) "
                                    "serialising this Cobbler's syncs")
    # the region this process serves (store_rollout/regions.py): the regions file's settings of
    # that region are applied over the others
    region: str = Field(DEFAULT_REGION, pattern=REGION_RE,
                        description="the region (Salt master) this worker serves")
    regions_file: str = Field("", description="YAML file naming the chain's regions")
    salt_master_config: str = Field(description="path of the master config file on this host")
    salt_master_address: str = Field(description="address minions use to reach the master")
    salt_publish_port: int = 4505
    salt_ret_port: int = 4506
    # the chain's store host platform where the inventory names none (a region may name its
    # own); empty: a store without one is refused (store_rollout/platforms.py)
    hypervisor_platform: Literal["", "sles15-xen", "sle16-kvm"] = Field(
        "", description="sles15-xen or sle16-kvm, for stores whose inventory names none")
    # empty: each store's platform's (xen:///system, qemu:///system); set: for every store, and
    # checked against each store's platform (the lab's own libvirt)
    hypervisor_libvirt_uri: str = ""
    # empty: each store's platform's (xen, kvm); qemu (emulation) runs on either
    vm_type: Literal["", "xen", "kvm", "qemu"] = ""
    vm_images_dir: str = "/srv/salt-images"
    # where a decommission keeps the export of a store's data disk (store_rollout/data_disk.py)
    data_export_dir: str = Field(DEFAULT_DATA_EXPORT_DIR, description="directory on this host")
    # the product a sle16-kvm host installs: SLES 16.0 (registers) or Leap 16.0
    sle16_product: Literal["sles", "leap"] = "sles"
    # where a SLES host registers (RMT, SUSE Manager or https://scc.suse.com) and the Prefect
    # Secret block of its registration code (SCC needs one; the code never is a setting)
    registration_url: str = Field("", description="the chain's RMT, SUSE Manager or SCC URL")
    registration_code_block: str = Field(
        "", description="Prefect Secret block of the registration code (SCC)")
    # added to each hypervisor's install (AutoYaST add-ons, Agama extra repositories): it installs
    # from them and keeps them for its updates; unset: the platform's own (update_repos.py);
    # [] installs from the installer's repositories and the registration's alone
    hypervisor_update_repos: Annotated[list[str] | None, NoDecode] = Field(
        None, description="repository URLs (space-separated or a JSON list), e.g. a mirror of "
                          "a platform's update repositories")
    erp_url: str = Field("", validate_default=True)
    erp_token_block: str = Field("", validate_default=True,
                                 description="Prefect Secret block of the ERP's token")
    erp_timeout_seconds: float = Field(15.0, gt=0, le=300, description="ERP read timeout")
    # the store hosts' BMC protocol where the inventory names none; their logins live only in
    # BMC Credentials Blocks (bmc_credentials_block, or the store's own)
    power_type: Literal["ipmi", "redfish"] = Field("ipmi", description="ipmi or redfish")
    # how long a host stays off in step 2's power cycle, for BMCs and power supplies that need
    # a pause (Cobbler's own reboot sleeps a fixed 5 s)
    # a decommission shuts a host down through its OS first, and cuts its power only when it
    # is still on this long after
    graceful_shutdown_seconds: float = Field(300.0, ge=0, le=3600)
    power_off_seconds: float = Field(5.0, ge=0, le=120, description="seconds a host stays "
                                     "off in step 2's power cycle")
    # how long each disruptive step disrupts the store (store_rollout/disruption.py): it starts
    # only in a maintenance window with that much time left
    disruption_seconds: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_DISRUPTION_SECONDS),
        description="seconds each disruptive step needs in a maintenance window")
    # a store host's time from its power-on into the install to its ready event before the
    # operators hear of it (tasks/notifications.py); approvals: store_rollout/settings_approvers.py
    hypervisor_ready_expected_seconds: float = Field(READY_EXPECTED_SECONDS, ge=10, le=86400)
    # the go-live gate asks failing checks again this long before it fails (tasks/go_live.py)
    go_live_settle_seconds: float = Field(120.0, ge=0, le=3600)
    # each flow run's heartbeat (tasks/run_health.py): the workers' and prefect-setup's value
    # must agree, as a run is taken for dead after three silent intervals
    heartbeat_seconds: float = Field(30.0, ge=4, le=300)  # the automation needs a 12-s window
    image_description: str = "leap16-jeos"
    # kiwi, or a builder another install registers (store_rollout/plugins.py)
    image_builder: Annotated[str, AfterValidator(known_builder)] = "kiwi"
    image_cache_dir: str = "/var/cache/store-rollout/images"
    image_params: dict[str, str] = Field(default_factory=dict)
    # where hypervisors download base images: the image cache served over HTTP(S) by any static
    # server, <image_base_url>/<key>/image.qcow2 (a path of this machine means nothing to them)
    image_base_url: str = Field(description="e.g. https://images.example/store-images")
    image_ca_bundle: str = Field("", description="PEM file of the CA that signed the image "
                                 "server's certificate (default: the hypervisor's trust store)")
    image_rate_limit: int = Field(0, ge=0, description="bytes/s per store download, 0: none")
    # image versions as data (store_rollout/image_versions.py): name -> description and params;
    # `image_version` the chain's (a store's inventory vm.image_version wins), "" unversioned
    image_versions: Annotated[dict[str, ImageVersion], BeforeValidator(checked_versions)] = \
        Field(default_factory=dict)
    image_version: str = ""
    # how long an image update keeps the old system disk for a manual `revert`
    image_keep_previous_hours: float = Field(168.0, ge=0, le=24 * 365)

    @model_validator(mode="after")
    def _chain_version_listed(self) -> RolloutSettings:
        known(self, self.image_version, "image_version")
        return self

    @field_validator("disruption_seconds")
    @classmethod
    def _disruptions(cls, value: dict[str, float]) -> dict[str, float]:
        return checked_disruptions(value)

    @field_validator(*_REPLACED_BY, mode="after")
    @classmethod
    def _required_without_block(cls, value: str, info: ValidationInfo) -> str:
        if not value and not info.data.get(_REPLACED_BY[str(info.field_name)]):
            raise PydanticCustomError("missing", "Field required")
        return value

    @field_validator("image_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL (hypervisors download images "
                             "from it)")
        return value.rstrip("/")

    @field_validator("hypervisor_update_repos", mode="before")
    @classmethod
    def _repo_list(cls, value: Any) -> Any:
        return repo_list(value)

    @field_validator("hypervisor_update_repos")
    @classmethod
    def _repo_urls(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else checked_repo_urls(value)

    def regions(self) -> Regions:
        """The chain's regions (one, `default`, without a regions file)."""
        return load_regions(self.regions_file)

    def public(self) -> dict[str, Any]:
        """For logs and artifacts (no secret is a setting: the Blocks' names only)."""
        return self.model_dump(mode="json")


def settings_file(environ: dict[str, str] | None = None) -> Path | None:
    """The settings file STORE_ROLLOUT_SETTINGS_FILE names, else None."""
    named = (os.environ if environ is None else environ).get(SETTINGS_FILE_ENV)
    return Path(named) if named else None


class _Environ(EnvSettingsSource):
    """STORE_ROLLOUT_<FIELD> from a given environment (os.environ, or a test's dict)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: dict[str, str]) -> None:
        self._given = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> dict[str, str | None]:
        return {k.lower(): v for k, v in self._given.items()}


# the sources of the load_settings call running in this context (a batch loads in threads)
_SOURCES: ContextVar[tuple[dict[str, str], Path | None]] = ContextVar("store_rollout_settings")


class _Sourced(RolloutSettings):
    """RolloutSettings from the current load_settings call's sources: Secret blocks, the given
    environment, the settings file. One class for all calls (one per call cost 5-20 ms each)."""

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env, path = _SOURCES.get()
        from_file = [DotEnvSettingsSource(settings_cls, env_file=path)] if path else []
        return (init_settings, _Environ(settings_cls, env), *from_file)


def load_settings(environ: dict[str, str] | None = None) -> RolloutSettings:
    env = dict(os.environ if environ is None else environ)
    path = settings_file(env)
    if path is not None and not path.is_file():
        raise SettingsError(f"{SETTINGS_FILE_ENV}={path}: no such file (name a settings file of "
                            "STORE_ROLLOUT_* lines, or unset it)")
    refuse_unsafe(env, path)
    regional = region_settings(env, path)
    token = _SOURCES.set((env, path))
    try:
        return RolloutSettings.model_validate(_Sourced(**regional).model_dump())
    except ValidationError as exc:
        problems, missing, invalid = [], [], []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            hint = (f"set STORE_ROLLOUT_{field.upper()}" +
                    (f", or name a Credentials Block with STORE_ROLLOUT_{_REPLACED_BY[field].upper()}"
                     if field in _REPLACED_BY else ""))
            problems.append(f"{field}: {err['msg']} ({hint})")
            if err["type"] == "missing":
                missing.append(f"STORE_ROLLOUT_{field.upper()}")
            else:
                invalid.append(problems[-1])
        named = f"or name a settings file with {SETTINGS_FILE_ENV}"
        # a shell without any settings misses eight of them: one line, not eight times the advice
        brief = "; ".join(([f"settings missing: {', '.join(missing)} (export them; secrets and "
                            "logins come from Prefect blocks they name, see docs/configuration.md; " + named +
                            ")"] if missing else []) + invalid)
        raise SettingsError(f"settings invalid: {'; '.join(problems)}; {named}",
                            tuple(missing), brief) from None
    finally:
        _SOURCES.reset(token)
