"""Where the rollout's outside systems are, and their credentials.

pydantic-settings sources, earlier ones win: Prefect Secret blocks for single secrets
(`STORE_ROLLOUT_<FIELD>_BLOCK=<block name>`), environment variables `STORE_ROLLOUT_<FIELD>`,
and `lab.json` of the lab named by STORE_ROLLOUT_LAB_DIR. The lab is only ever used when named:
a `.lab/` that happens to exist next to a production worker's checkout is ignored.

Credentials Blocks (tasks/cobbler.py, tasks/erp.py) are named here too
(`STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK`...); loading them is the tasks' business, so with a
Block named the service's own fields (URL, user, secret) are no longer required.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
SECRET_FIELDS = ("cobbler_password", "erp_token", "power_password")
# a named credentials Block replaces these fields; without one they are required
BLOCK_REPLACES = {"cobbler_credentials_block": ("cobbler_url", "cobbler_user", "cobbler_password"),
                  "erp_credentials_block": ("erp_url", "erp_token")}
_REPLACED_BY = {name: block for block, names in BLOCK_REPLACES.items() for name in names}
# openSUSE Leap 15.6's update repositories for what a Xen host installs: oss, SLE's updates of
# the packages Leap takes from SLE (Xen, libvirt, Salt among them) and backports (non-oss has
# nothing a hypervisor installs)
LEAP_UPDATE_REPOS = ("https://download.opensuse.org/update/leap/15.6/oss/",
                     "https://download.opensuse.org/update/leap/15.6/sle/",
                     "https://download.opensuse.org/update/leap/15.6/backports/")
_REPO_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s<>&\"']+")


class SettingsError(ValueError):
    """Settings are missing or invalid; the message names the field and where to set it.

    `missing`: the environment variables of the required settings nobody set; `brief`: all of it
    in one line for a person at a terminal (the message, for logs, has each field's detail)."""

    def __init__(self, message: str, missing: tuple[str, ...] = (), brief: str = "") -> None:
        super().__init__(message)
        self.missing = missing
        self.brief = brief or message


class RolloutSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STORE_ROLLOUT_", extra="ignore", frozen=True)

    # declared before the fields they replace: _required_without_block reads them
    cobbler_credentials_block: str = Field("", description="name of a Cobbler Credentials Block")
    erp_credentials_block: str = Field("", description="name of an ERP Credentials Block")
    bmc_credentials_block: str = Field("", description="name of a BMC Credentials Block")
    cobbler_url: str = Field("", validate_default=True,
                             description="Cobbler XML-RPC URL, e.g. http://cobbler:25151/")
    cobbler_user: str = Field("", validate_default=True)
    cobbler_password: SecretStr = Field(SecretStr(""), validate_default=True)
    cobbler_allow_default_credentials: bool = False
    salt_master_config: str = Field(description="path of the master config file on this host")
    salt_master_address: str = Field(description="address minions use to reach the master")
    salt_publish_port: int = 4505
    salt_ret_port: int = 4506
    hypervisor_libvirt_uri: str = "xen:///system"
    vm_type: Literal["xen", "kvm", "qemu"] = "xen"
    vm_images_dir: str = "/srv/salt-images"
    # added to each hypervisor's install (AutoYaST add-ons): it installs from them, not from the
    # GA tree alone, and keeps them for its updates; [] installs GA packages only
    hypervisor_update_repos: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(LEAP_UPDATE_REPOS),
        description="repository URLs (space-separated or a JSON list), e.g. a mirror of Leap "
                    "15.6's update repositories")
    erp_url: str = Field("", validate_default=True)
    erp_token: SecretStr = Field(SecretStr(""), validate_default=True)
    erp_timeout_seconds: float = Field(15.0, gt=0, le=300, description="ERP read timeout")
    power_type: str = "ipmilanplus"
    power_address: str = ""
    # BMC login for Cobbler's fence agent; a store's inventory entry may override both
    power_user: str = ""
    power_password: SecretStr = SecretStr("")
    image_description: str = "leap-jeos"
    image_builder: Literal["lab", "kiwi"] = "kiwi"
    image_cache_dir: str = "/var/cache/store-rollout/images"
    image_params: dict[str, str] = Field(default_factory=dict)
    # where hypervisors download base images: the image cache served over HTTP(S) by any static
    # server, <image_base_url>/<key>/image.qcow2 (a path of this machine means nothing to them)
    image_base_url: str = Field(description="e.g. https://images.example/store-images")
    image_ca_bundle: str = Field("", description="PEM file of the CA that signed the image "
                                 "server's certificate (default: the hypervisor's trust store)")
    image_rate_limit: int = Field(0, ge=0, description="bytes/s per store download, 0: none")
    lab: bool = False

    @field_validator(*_REPLACED_BY, mode="after")
    @classmethod
    def _required_without_block(cls, value: str | SecretStr, info: ValidationInfo) -> str | SecretStr:
        empty = not (value.get_secret_value() if isinstance(value, SecretStr) else value)
        if empty and not info.data.get(_REPLACED_BY[str(info.field_name)]):
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
        if isinstance(value, str):  # the environment's: a JSON list or space-separated URLs
            if value.strip().startswith("["):
                try:
                    return json.loads(value)
                except ValueError as exc:
                    raise ValueError(f"not a JSON list of URLs ({exc})") from None
            return value.split()
        return value

    @field_validator("hypervisor_update_repos")
    @classmethod
    def _repo_urls(cls, value: list[str]) -> list[str]:
        # they travel space-separated in Cobbler's autoinstall_meta and land in the profile's XML
        bad = [url for url in value if not _REPO_URL.fullmatch(url)]
        if bad:
            raise ValueError(f"{bad} not repository URLs: scheme://host/path, no spaces and none "
                             "of <>&\"' (percent-encode them)")
        if len(set(value)) != len(value):
            raise ValueError(f"{value} lists a repository twice")
        return value

    def public(self) -> dict[str, Any]:
        """For logs and artifacts: secrets masked."""
        data = self.model_dump(mode="json")
        for name in SECRET_FIELDS:
            data[name] = "**********"
        return data


def _lab_values(lab_dir: Path) -> dict[str, Any]:
    info = json.loads((lab_dir / "lab.json").read_text())
    return {
        "cobbler_url": info["cobbler_url"], "cobbler_user": info["cobbler_user"],
        "cobbler_password": info["cobbler_password"],
        "salt_master_config": info["salt_master_config"],
        "salt_master_address": info["salt_master_address"],
        "salt_publish_port": info["salt_publish_port"], "salt_ret_port": info["salt_ret_port"],
        "hypervisor_libvirt_uri": info["libvirt_uri"], "vm_type": info.get("vm_type", "qemu"),
        "vm_images_dir": info["vm_images_dir"],
        "erp_url": info["erp_url"], "erp_token": info["erp_token"],
        "power_type": info["power_type"], "power_address": info["power_address"],
        "power_user": info["power_user"], "power_password": info["power_password"],
        # the full lab boots a real image; the default lab's guests are simulated processes
        "image_description": "lab-debian",
        "image_builder": "kiwi" if info.get("full") else "lab",
        "image_cache_dir": info["image_cache_dir"],
        "image_base_url": info["image_base_url"],
        "image_params": {"SALT_MASTER": info["salt_master_address"],
                         "SALT_MASTER_PORT": str(info["salt_ret_port"])},
        "lab": True,
    }


def active_lab_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The lab the settings come from: the one STORE_ROLLOUT_LAB_DIR names, else None."""
    explicit = (os.environ if environ is None else environ).get("STORE_ROLLOUT_LAB_DIR")
    return Path(explicit) if explicit else None


def running_labs(homes: tuple[Path, ...] | None = None) -> list[Path]:
    """Labs running on this machine where labs live by default: `.lab` (`lab up`) and `.lab-*`
    (the tests' `.lab-test*`) in the checkout and in the current directory. A lab runs when a
    process its lab.json records is alive. Only ever named to a person (the CLI's hint when
    settings are missing): settings come from a lab only when STORE_ROLLOUT_LAB_DIR names it."""
    found: list[Path] = []
    for home in dict.fromkeys(h.resolve() for h in (homes or (REPO_ROOT, Path.cwd()))):
        for state_dir in sorted(home.glob(".lab*")):
            if state_dir not in found and _lab_alive(state_dir / "lab.json"):
                found.append(state_dir)
    return found


def _lab_alive(lab_json: Path) -> bool:
    """Any service of lab.json alive, judged as lab/procs.py's ProcessRecord.alive does (the
    start time guards against a reused PID); production code does not import lab/."""
    import psutil

    try:
        services = json.loads(lab_json.read_text()).get("services") or {}
        records = [(int(s["pid"]), float(s["create_time"])) for s in services.values()]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False  # no lab.json, or not one a lab wrote
    for pid, create_time in records:
        try:
            proc = psutil.Process(pid)
            if (abs(proc.create_time() - create_time) < 0.05
                    and proc.status() != psutil.STATUS_ZOMBIE):
                return True
        except psutil.Error:
            continue
    return False


def prefect_settings_of_lab(environ: dict[str, str] | None = None) -> dict[str, str]:
    """PREFECT_API_URL and PREFECT_HOME of the lab STORE_ROLLOUT_LAB_DIR names, for the CLI to
    apply as Prefect settings; {} without a lab or when PREFECT_API_URL is set explicitly."""
    env = os.environ if environ is None else environ
    lab_dir = active_lab_dir(dict(env))
    if lab_dir is None or "PREFECT_API_URL" in env or not (lab_dir / "lab.json").exists():
        return {}
    info = json.loads((lab_dir / "lab.json").read_text())
    return {
        "PREFECT_API_URL": info["prefect_api_url"],
        "PREFECT_HOME": env.get("PREFECT_HOME", str(lab_dir / "prefect-client-home")),
    }


class _Environ(EnvSettingsSource):
    """STORE_ROLLOUT_<FIELD> from a given environment (os.environ, or a test's dict)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: dict[str, str]) -> None:
        self._given = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> dict[str, str | None]:
        return {k.lower(): v for k, v in self._given.items()}


class _LabJson(PydanticBaseSettingsSource):
    """The settings a running lab hands over in its lab.json."""

    def __init__(self, settings_cls: type[BaseSettings], lab_dir: Path | None) -> None:
        super().__init__(settings_cls)
        self.lab_dir = lab_dir

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ does the work

    def __call__(self) -> dict[str, Any]:
        if self.lab_dir is None:
            return {}
        if not (self.lab_dir / "lab.json").exists():
            raise SettingsError(f"STORE_ROLLOUT_LAB_DIR={self.lab_dir} has no lab.json: "
                                "run `store-rollout lab up` or unset it")
        return _lab_values(self.lab_dir)


def _secret_from_block(block_name: str) -> str:
    from prefect.blocks.system import Secret

    block: Any = Secret.load(block_name)
    return str(block.get())


def load_settings(environ: dict[str, str] | None = None) -> RolloutSettings:
    env = dict(os.environ if environ is None else environ)
    blocks = {name: _secret_from_block(env[f"STORE_ROLLOUT_{name.upper()}_BLOCK"])
              for name in SECRET_FIELDS if env.get(f"STORE_ROLLOUT_{name.upper()}_BLOCK")}
    lab_dir = active_lab_dir(env)

    class Sourced(RolloutSettings):
        @classmethod
        def settings_customise_sources(
                cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                env_settings: PydanticBaseSettingsSource,
                dotenv_settings: PydanticBaseSettingsSource,
                file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (InitSettingsSource(settings_cls, init_kwargs=blocks),
                    _Environ(settings_cls, env), _LabJson(settings_cls, lab_dir))

    try:
        return RolloutSettings.model_validate(Sourced().model_dump())  # type: ignore[call-arg]
    except ValidationError as exc:
        problems, missing, invalid = [], [], []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            hint = (f"set STORE_ROLLOUT_{field.upper()}" +
                    (f" or STORE_ROLLOUT_{field.upper()}_BLOCK (a Prefect Secret block)"
                     if field in SECRET_FIELDS else "") +
                    (f", or name a Credentials Block with STORE_ROLLOUT_{_REPLACED_BY[field].upper()}"
                     if field in _REPLACED_BY else ""))
            problems.append(f"{field}: {err['msg']} ({hint})")
            if err["type"] == "missing":
                missing.append(f"STORE_ROLLOUT_{field.upper()}")
            else:
                invalid.append(problems[-1])
        lab = "or name a running lab with STORE_ROLLOUT_LAB_DIR"
        # a shell without any settings misses eight of them: one line, not eight times the advice
        brief = "; ".join(([f"settings missing: {', '.join(missing)} (export them; secrets and "
                            "logins may come from Prefect blocks instead, see README; " + lab + ")"]
                           if missing else []) + invalid)
        raise SettingsError(f"settings invalid: {'; '.join(problems)}; {lab}",
                            tuple(missing), brief) from None
