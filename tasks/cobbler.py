"""Cobbler 3.3 over XML-RPC: hypervisor system records, netboot, sync and power.

`CobblerClient` owns the protocol and maps Cobbler's failures (xmlrpc Fault, the '~' "not
found" string, socket errors) to `CobblerError` subclasses at one boundary.
`CobblerCredentials` and `BmcCredentials` are Prefect Blocks; `cobbler_client()` and
`bmc_credentials()` are where tasks get them (a named Block, else the settings).
"""

from __future__ import annotations

import http.client
import logging
import re
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from xml.parsers.expat import ExpatError

from prefect import get_run_logger, task
from prefect.blocks.abstract import CredentialsBlock
from prefect.blocks.core import Block
from pydantic import Field, SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from store_rollout.contracts import ROOT_PASSWORD_HASH_META
from store_rollout.instrument import external
from store_rollout.inventory import Store
from store_rollout.settings import RolloutSettings, load_settings
from tasks.blocks import load_block
from tasks.retry import retry_on

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DEFAULT_CREDENTIALS = ("cobbler", "cobbler")
T = TypeVar("T")
_UNKNOWN_NAME = re.compile(r"unknown \w+ name")


class CobblerError(Exception):
    """A Cobbler call failed."""


class CobblerUnavailable(CobblerError):
    """Cobbler did not answer (connection refused, reset or timed out): worth retrying."""


class CobblerAuthError(CobblerError):
    """Cobbler refused the credentials (or an HTTP proxy in front of it answered 401/403)."""


class CobblerNotFound(CobblerError):
    """The named Cobbler object does not exist."""


class CobblerRejected(CobblerError):
    """Cobbler rejected a value (bad MAC, duplicate MAC/IP...), or its URL answered another 4xx."""


class _SyncRunning(CobblerError):
    """A background sync has not finished yet."""


class _TimeoutTransport(xmlrpc.client.Transport):
    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        conn = super().make_connection(host)
        conn.timeout = self.timeout
        return conn


@dataclass(frozen=True)
class SystemSpec:
    """What the rollout wants Cobbler to know about one hypervisor."""

    name: str
    hostname: str
    mac: str
    profile: str
    ip: str | None = None
    netmask: str | None = None
    gateway: str | None = None
    interface: str = "eth0"
    # not in repr: the one-time token and the root password's hash
    autoinstall_meta: dict[str, str] = field(default_factory=dict, repr=False)
    power_type: str = ""
    power_address: str = ""
    power_user: str = ""
    power_pass: SecretStr | str = field(default="", repr=False)  # the BMC password
    power_id: str = ""

    def interface_fields(self) -> dict[str, Any]:
        i = self.interface
        fields: dict[str, Any] = {f"macaddress-{i}": self.mac, f"dnsname-{i}": self.hostname,
                                  f"static-{i}": bool(self.ip)}
        if self.ip:
            fields[f"ipaddress-{i}"] = self.ip
        if self.netmask:
            fields[f"netmask-{i}"] = self.netmask
        return fields


# never shown in a plan: the BMC password and the hash of root's password (at most "changes";
# a plan's spec has no hash, it never reads the password), and the one-time token each install
# gets anew
SECRET_FIELDS = frozenset({"power_pass", f"autoinstall_meta.{ROOT_PASSWORD_HASH_META}"})
ONE_TIME_FIELDS = frozenset({"autoinstall_meta.autosign_token"})


def spec_fields(spec: SystemSpec) -> dict[str, Any]:
    """The record fields `upsert_system` sets for `spec`, flat (`interfaces.eth0.mac_address`,
    `autoinstall_meta.<key>`), as `record_fields` reads them back from Cobbler."""
    i = spec.interface
    fields: dict[str, Any] = {
        "profile": spec.profile, "hostname": spec.hostname,
        f"interfaces.{i}.mac_address": spec.mac.lower(), f"interfaces.{i}.dns_name": spec.hostname,
        f"interfaces.{i}.static": bool(spec.ip),
    }
    if spec.ip:
        fields[f"interfaces.{i}.ip_address"] = spec.ip
    if spec.netmask:
        fields[f"interfaces.{i}.netmask"] = spec.netmask
    if spec.gateway:
        fields["gateway"] = spec.gateway
    fields.update({f"autoinstall_meta.{k}": str(v) for k, v in spec.autoinstall_meta.items()})
    for key in ("power_type", "power_address", "power_user", "power_pass", "power_id"):
        value = getattr(spec, key)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value:
            fields[key] = value
    fields["netboot_enabled"] = True
    return fields


def record_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A Cobbler system record (get_system) flattened the way `spec_fields` names fields."""
    fields: dict[str, Any] = {k: v for k, v in record.items()
                              if isinstance(v, str | bool | int) and k != "interfaces"}
    for name, iface in (record.get("interfaces") or {}).items():
        for key, value in (iface or {}).items():
            fields[f"interfaces.{name}.{key}"] = value.lower() if key == "mac_address" else value
    meta = record.get("autoinstall_meta") or {}
    fields.update({f"autoinstall_meta.{k}": str(v) for k, v in meta.items()})
    return fields


@dataclass(frozen=True)
class FieldChange:
    """One field a rollout's upsert would set differently; values None for secret fields."""

    field: str
    current: Any
    wanted: Any

    def describe(self) -> str:
        if self.field in SECRET_FIELDS:
            return f"{self.field}: changes (secret, not shown)"
        if self.current is None:
            return f"{self.field}: {self.wanted!r} (new)"
        return f"{self.field}: {self.current!r} -> {self.wanted!r}"


def system_changes(spec: SystemSpec, record: dict[str, Any] | None) -> list[FieldChange]:
    """What upserting `spec` would change in `record` (None: the record is created, every
    field is new), field by field, without secret values."""
    current = record_fields(record) if record is not None else {}
    changes = []
    for key, wanted in spec_fields(spec).items():
        if key in ONE_TIME_FIELDS or current.get(key) == wanted:
            continue
        if key in SECRET_FIELDS:
            changes.append(FieldChange(key, None, None))
        else:
            changes.append(FieldChange(key, current.get(key), wanted))
    return changes


class CobblerClient:
    """Keyword-only, explicit timeout; one login token reused until Cobbler drops it."""

    def __init__(self, *, url: str, user: str, password: SecretStr | str,
                 timeout: float = DEFAULT_TIMEOUT, allow_default_credentials: bool = False) -> None:
        secret = password if isinstance(password, SecretStr) else SecretStr(password)
        if (user, secret.get_secret_value()) == DEFAULT_CREDENTIALS and not allow_default_credentials:
            raise CobblerAuthError(
                "refusing Cobbler's default credentials cobbler/cobbler: set cobbler_user and "
                "cobbler_password (Secret block or env) to a real account")
        self.url = url
        self.user = user
        self._password = secret
        self._proxy: Any = xmlrpc.client.ServerProxy(url, allow_none=True,
                                                transport=_TimeoutTransport(timeout))
        self._token: str | None = None

    def __repr__(self) -> str:
        return f"CobblerClient(url={self.url!r}, user={self.user!r})"

    # -- boundary ----------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            with external("cobbler"):
                return fn()
        except xmlrpc.client.Fault as fault:
            text = str(fault.faultString)
            if "login failed" in text:
                raise CobblerAuthError(f"Cobbler at {self.url}: login failed for {self.user!r}") from fault
            if "invalid token" in text or "token" in text and "format" in text:
                self._token = None
                raise CobblerUnavailable(f"Cobbler {what}: token expired") from fault
            detail = text.split(':', 1)[-1].strip()
            if _UNKNOWN_NAME.search(text):  # Cobbler's CX "internal error, unknown system name x"
                raise CobblerNotFound(f"Cobbler {what}: {detail}") from fault
            raise CobblerRejected(f"Cobbler {what}: {detail}") from fault
        except xmlrpc.client.ProtocolError as exc:  # an HTTP status other than 200
            status = f"Cobbler at {self.url} answered HTTP {exc.errcode} {exc.errmsg} during {what}"
            if exc.errcode in (401, 403):  # a proxy in front of Cobbler refused us
                raise CobblerAuthError(status) from None
            if 400 <= exc.errcode < 500 and exc.errcode not in (408, 429):  # wrong URL, not transient
                raise CobblerRejected(status) from None
            raise CobblerUnavailable(status) from None
        except (ExpatError, xmlrpc.client.ResponseError) as exc:  # 200 but not an XML-RPC answer
            raise CobblerError(f"Cobbler at {self.url} answered {what} with a body that is not "
                               f"XML-RPC (is cobbler_url its /cobbler_api?): {exc}") from None
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise CobblerUnavailable(f"Cobbler at {self.url} unreachable during {what}: {exc}") from exc

    def token(self) -> str:
        if self._token is None:
            self._token = self._call("login", lambda: self._proxy.login(
                self.user, self._password.get_secret_value()))
        return self._token

    # -- reads -------------------------------------------------------------------------
    def version(self) -> float:
        return float(self._call("version", self._proxy.version))

    def profile_exists(self, name: str) -> bool:
        return isinstance(self._call(f"get_profile {name}", lambda: self._proxy.get_profile(name)),
                          dict)

    def get_system(self, name: str) -> dict[str, Any] | None:
        found = self._call(f"get_system {name}", lambda: self._proxy.get_system(name))
        return found if isinstance(found, dict) else None  # '~' means missing

    def find_systems(self, **criteria: str) -> list[str]:
        return list(self._call("find_system", lambda: self._proxy.find_system(criteria)))

    def render_autoinstall(self, name: str) -> str:
        return str(self._call("generate_autoinstall",
                              lambda: self._proxy.generate_autoinstall("", name)))

    def render_profile_autoinstall(self, profile: str) -> str:
        """The profile's autoinstall file as Cobbler renders it for no particular system."""
        return str(self._call(f"generate_autoinstall {profile}",
                              lambda: self._proxy.generate_autoinstall(profile, "")))

    def settings(self) -> dict[str, Any]:
        return dict(self._call("get_settings", lambda: self._proxy.get_settings()) or {})

    # -- writes ------------------------------------------------------------------------
    def upsert_system(self, spec: SystemSpec) -> bool:
        """Create or update the record; True when it was created. Never a second record."""
        for other in self.find_systems(mac_address=spec.mac):
            if other != spec.name:
                raise CobblerRejected(f"MAC {spec.mac} already belongs to Cobbler system {other!r}")
        existing = self.get_system(spec.name)
        tok = self.token()
        if existing is None:
            handle = self._call("new_system", lambda: self._proxy.new_system(tok))
            self._modify(handle, "name", spec.name)
        else:
            handle = self._call("get_system_handle",
                                lambda: self._proxy.get_system_handle(spec.name, tok))
        self._modify(handle, "profile", spec.profile)
        self._modify(handle, "hostname", spec.hostname)
        self._modify(handle, "modify_interface", spec.interface_fields())
        if spec.gateway:
            self._modify(handle, "gateway", spec.gateway)
        self._modify(handle, "autoinstall_meta", spec.autoinstall_meta)
        for key in ("power_type", "power_address", "power_user", "power_pass", "power_id"):
            value = getattr(spec, key)
            if isinstance(value, SecretStr):  # unwrapped only on its way to Cobbler
                value = value.get_secret_value()
            if value:
                self._modify(handle, key, value)
        self._modify(handle, "netboot_enabled", True)
        self._confirmed(f"save_system {spec.name}",
                        self._call(f"save_system {spec.name}",
                                   lambda: self._proxy.save_system(handle, tok)),
                        f"system {spec.name!r} was not saved; see Cobbler's log")
        return existing is None

    def _modify(self, handle: str, key: str, value: Any) -> None:
        tok = self.token()
        ok = self._call(f"modify_system {key}",
                        lambda: self._proxy.modify_system(handle, key, value, tok))
        if ok is False:
            raise CobblerRejected(f"Cobbler refused system field {key!r}")

    @staticmethod
    def _confirmed(what: str, answer: Any, why: str) -> None:
        """Some calls answer False, not a fault, when Cobbler did not do what was asked: going on
        would report done what was not (netboot still on, a host never power-cycled)."""
        if answer is False:
            raise CobblerRejected(f"Cobbler answered False to {what}: {why}")

    def sync(self) -> None:
        """Full sync. It deletes and rewrites every PXE config, so a machine PXE-booting
        meanwhile finds none: a rollout syncs only its own system (`sync_system`)."""
        tok = self.token()
        self._confirmed("sync", self._call("sync", lambda: self._proxy.sync(tok)),
                        "the PXE configs were not written; see Cobbler's log")

    def sync_system(self, name: str, timeout: float = 120) -> None:
        """Sync this system's PXE (and DHCP/DNS when Cobbler manages them) and wait for it."""
        tok = self.token()
        task_id = self._call(f"sync {name}", lambda: self._proxy.background_syncsystems(
            {"systems": [name]}, tok))
        for attempt in Retrying(stop=stop_after_delay(timeout),
                                wait=wait_exponential(multiplier=0.1, max=2),
                                retry=retry_if_exception_type(_SyncRunning), reraise=True):
            with attempt:
                state = self._call(f"sync {name} status",
                                   lambda: self._proxy.get_task_status(task_id))[2]
                if state in ("notification", "running"):  # queued, then running
                    raise _SyncRunning(f"Cobbler sync of {name} still running after {timeout:.0f}s")
                if state != "complete":
                    raise CobblerError(f"Cobbler sync of {name} ended {state!r}; see Cobbler's "
                                       f"log for task {task_id}")

    def power(self, name: str, action: str) -> Any:
        """`status`: True when the host is on. Any other action: True, or CobblerRejected when
        Cobbler answers False (its fence agent did not carry it out)."""
        if action not in ("on", "off", "reboot", "status"):
            raise ValueError(f"power action {action!r}: use on, off, reboot or status")
        tok = self.token()

        def call() -> Any:
            handle = self._proxy.get_system_handle(name, tok)
            return self._proxy.power_system(handle, action, tok)

        answer = self._call(f"power {action} {name}", call)
        if action != "status":  # for status, False only means the host is off
            self._confirmed(f"power {action} {name}", answer,
                            f"the fence agent did not power-{action} system {name!r}: check its "
                            "power_type, power_address and BMC login, and Cobbler's log")
        return answer

    def disable_netboot(self, name: str) -> None:
        tok = self.token()
        answer = self._call(f"disable_netboot {name}",
                            lambda: self._proxy.disable_netboot(name, tok))
        # Cobbler 3.3 answers False, and changes nothing, when its pxe_just_once setting is off
        # or the system is gone
        self._confirmed(f"disable_netboot {name}", answer,
                        f"netboot of system {name!r} is still on: set pxe_just_once: true in "
                        f"Cobbler's settings (restart cobblerd), or check the system exists "
                        f"(cobbler system report --name {name})")

    def remove_system(self, name: str) -> bool:
        if self.get_system(name) is None:
            return False
        tok = self.token()
        self._confirmed(f"remove_system {name}",
                        self._call(f"remove_system {name}",
                                   lambda: self._proxy.remove_system(name, tok)),
                        f"system {name!r} was not removed; see Cobbler's log")
        return True


# --------------------------------------------------------------------------- Prefect task

class CobblerCredentials(CredentialsBlock):
    """Login to Cobbler's XML-RPC API (`STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK=<name>`)."""

    _block_type_name = "Cobbler Credentials"

    url: str = Field(title="URL", description="Cobbler XML-RPC URL, e.g. http://cobbler/cobbler_api")
    username: str = Field(title="Username", description="Cobbler API user.")
    password: SecretStr = Field(title="Password", description="Cobbler API password; never logged.")
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, title="Timeout",
                           description="Seconds one XML-RPC call may take.")
    allow_default_credentials: bool = Field(
        default=False, title="Allow default credentials",
        description="Accept cobbler/cobbler (a throwaway Cobbler only).")

    def get_client(self) -> CobblerClient:
        return CobblerClient(url=self.url, user=self.username, password=self.password,
                             timeout=self.timeout,
                             allow_default_credentials=self.allow_default_credentials)


class BmcCredentials(Block):
    """BMC login Cobbler's fence agent uses to power-cycle a hypervisor
    (`STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK=<name>`). Not a CredentialsBlock: the project talks to
    no BMC itself, Cobbler does; the password is unwrapped only by `CobblerClient.upsert_system`."""

    _block_type_name = "BMC Credentials"

    username: str = Field(title="Username", description="BMC login (Cobbler's power_user).")
    password: SecretStr = Field(title="Password",
                                description="BMC password (Cobbler's power_pass); never logged.")

    def missing(self) -> list[str]:
        """Which of user and password are empty (preflight refuses a store without both)."""
        return [n for n, v in (("user", self.username), ("password", self.password.get_secret_value()))
                if not v]


def cobbler_client(settings: RolloutSettings | None = None) -> CobblerClient:
    """The Cobbler client every task uses: from the Block STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK
    names, else from the cobbler_* settings (env or lab)."""
    settings = settings or load_settings()
    if settings.cobbler_credentials_block:
        return load_block(CobblerCredentials, settings.cobbler_credentials_block).get_client()
    return CobblerCredentials(
        url=settings.cobbler_url, username=settings.cobbler_user, password=settings.cobbler_password,
        allow_default_credentials=settings.cobbler_allow_default_credentials).get_client()


def bmc_credentials(store: Store, settings: RolloutSettings) -> BmcCredentials:
    """The BMC login of a store's hypervisor: its inventory entry's, else the Block
    STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK names, else the power_user/power_password settings."""
    hv = store.hypervisor
    base = (load_block(BmcCredentials, settings.bmc_credentials_block) if settings.bmc_credentials_block
            else BmcCredentials(username=settings.power_user, password=settings.power_password))
    return BmcCredentials(username=hv.power_user or base.username,
                          password=hv.power_password or base.password)


@task(name="disable_hypervisor_netboot", task_run_name="disable-netboot-{store.store_id}",
      retries=4, retry_delay_seconds=[2, 4, 8, 16], retry_condition_fn=retry_on(CobblerUnavailable))
def disable_hypervisor_netboot(store: Store) -> dict[str, Any]:
    """Rollback: keep the Cobbler record (the hardware is still there) but turn netboot off, so a
    power cycle boots the installed system instead of reinstalling it."""
    client = cobbler_client()
    system = store.cobbler_system
    exists = client.get_system(system) is not None
    if exists:
        client.disable_netboot(system)
    get_run_logger().info("store %s: Cobbler system %s netboot off (exists: %s)",
                          store.store_id, system, exists)
    return {"system": system, "exists": exists, "netboot": False}
