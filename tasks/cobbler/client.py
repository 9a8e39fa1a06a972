"""Cobbler 3.3 over XML-RPC: hypervisor system records, netboot and sync (step 2 powers a host
through its BMC itself, tasks/bmc/).

`CobblerClient` owns the protocol and maps Cobbler's failures (xmlrpc Fault, the '~' "not
found" string, socket errors) to `CobblerError` subclasses at one boundary.
"""

from __future__ import annotations

import http.client
import re
import ssl
import xmlrpc.client
from collections.abc import Callable
from typing import Any, TypeVar
from xml.parsers.expat import ExpatError

from pydantic import SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from store_rollout.instrument import external
from store_rollout.transport import checked_url
from tasks.cobbler.errors import (
    CobblerAuthError,
    CobblerError,
    CobblerNotFound,
    CobblerRejected,
    CobblerUnavailable,
    _SyncRunning,
)
from tasks.cobbler.systems import BMC_FIELDS, SystemSpec

DEFAULT_TIMEOUT = 30.0
DEFAULT_CREDENTIALS = ("cobbler", "cobbler")
T = TypeVar("T")
_UNKNOWN_NAME = re.compile(r"unknown \w+ name")


class _TimeoutTransport(xmlrpc.client.Transport):
    def __init__(self, timeout: float) -> None:
        super().__init__()
        self.timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        conn = super().make_connection(host)
        conn.timeout = self.timeout
        return conn


class _TimeoutSafeTransport(xmlrpc.client.SafeTransport):
    """https://, the certificate verified (against `ca_bundle` when given)."""

    def __init__(self, timeout: float, ca_bundle: str = "") -> None:
        super().__init__(context=ssl.create_default_context(cafile=ca_bundle or None))
        self.timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPSConnection:
        conn = super().make_connection(host)
        conn.timeout = self.timeout
        return conn


class CobblerClient:
    """Keyword-only, explicit timeout; one login token reused until Cobbler drops it."""

    def __init__(self, *, url: str, user: str, password: SecretStr | str,
                 timeout: float = DEFAULT_TIMEOUT, allow_default_credentials: bool = False,
                 insecure_http: bool = False, ca_bundle: str = "") -> None:
        checked_url(url, "cobbler", "cobbler_url", insecure_http)
        secret = password if isinstance(password, SecretStr) else SecretStr(password)
        if (user, secret.get_secret_value()) == DEFAULT_CREDENTIALS and not allow_default_credentials:
            raise CobblerAuthError(
                "refusing Cobbler's default credentials cobbler/cobbler: set cobbler_user and "
                "cobbler_password (its Block) to a real account")
        self.url = url
        self.user = user
        self._password = secret
        transport = (_TimeoutSafeTransport(timeout, ca_bundle) if url.lower().startswith("https:")
                     else _TimeoutTransport(timeout))
        self._proxy: Any = xmlrpc.client.ServerProxy(url, allow_none=True, transport=transport)
        self._token: str | None = None

    def __repr__(self) -> str:
        return f"CobblerClient(url={self.url!r}, user={self.user!r})"

    def close(self) -> None:
        """Closes the proxy's connection (xmlrpc.client's own way: calling it with "close")."""
        self._proxy("close")()

    # -- boundary ----------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], name: str | None = None) -> T:
        """`fn()`, its failure mapped to a CobblerError naming `what` (the call and its
        arguments; the error's `operation` is its first word) and the object `name`."""
        def error(cls: type[CobblerError], message: str, status: int | None = None) -> CobblerError:
            return cls(message, operation=what.split()[0], subject=name, status=status)

        try:
            with external("cobbler"):
                return fn()
        except xmlrpc.client.Fault as fault:
            text = str(fault.faultString)
            if "login failed" in text:
                raise error(CobblerAuthError, f"Cobbler at {self.url}: login failed for "
                                              f"{self.user!r}") from fault
            if "invalid token" in text or "token" in text and "format" in text:
                self._token = None
                raise error(CobblerUnavailable, f"Cobbler {what}: token expired") from fault
            detail = text.split(':', 1)[-1].strip()
            if _UNKNOWN_NAME.search(text):  # Cobbler's CX "internal error, unknown system name x"
                raise error(CobblerNotFound, f"Cobbler {what}: {detail}") from fault
            raise error(CobblerRejected, f"Cobbler {what}: {detail}") from fault
        except xmlrpc.client.ProtocolError as exc:  # an HTTP status other than 200
            status = f"Cobbler at {self.url} answered HTTP {exc.errcode} {exc.errmsg} during {what}"
            if exc.errcode in (401, 403):  # a proxy in front of Cobbler refused us
                raise error(CobblerAuthError, status, exc.errcode) from None
            if 400 <= exc.errcode < 500 and exc.errcode not in (408, 429):  # wrong URL, not transient
                raise error(CobblerRejected, status, exc.errcode) from None
            raise error(CobblerUnavailable, status, exc.errcode) from None
        except (ExpatError, xmlrpc.client.ResponseError) as exc:  # 200 but not an XML-RPC answer
            raise error(CobblerError, f"Cobbler at {self.url} answered {what} with a body that is "
                                      f"not XML-RPC (is cobbler_url its /cobbler_api?): {exc}",
                        200) from None
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise error(CobblerUnavailable, f"Cobbler at {self.url} unreachable during {what}: "
                                            f"{exc}") from exc

    def token(self) -> str:
        if self._token is None:
            self._token = self._call("login", lambda: self._proxy.login(
                self.user, self._password.get_secret_value()))
        return self._token

    # -- reads -------------------------------------------------------------------------
    def version(self) -> float:
        return float(self._call("version", self._proxy.version))

    def profile_exists(self, name: str) -> bool:
        return isinstance(self._call(f"get_profile {name}", lambda: self._proxy.get_profile(name),
                                     name),
                          dict)

    def get_system(self, name: str) -> dict[str, Any] | None:
        found = self._call(f"get_system {name}", lambda: self._proxy.get_system(name), name)
        return found if isinstance(found, dict) else None  # '~' means missing

    def find_systems(self, **criteria: str) -> list[str]:
        return list(self._call("find_system", lambda: self._proxy.find_system(criteria)))

    def render_autoinstall(self, name: str) -> str:
        return str(self._call("generate_autoinstall",
                              lambda: self._proxy.generate_autoinstall("", name), name))

    def render_profile_autoinstall(self, profile: str) -> str:
        """The profile's autoinstall file as Cobbler renders it for no particular system."""
        return str(self._call(f"generate_autoinstall {profile}",
                              lambda: self._proxy.generate_autoinstall(profile, ""), profile))

    def settings(self) -> dict[str, Any]:
        return dict(self._call("get_settings", lambda: self._proxy.get_settings()) or {})

    # -- writes ------------------------------------------------------------------------
    def upsert_system(self, spec: SystemSpec) -> bool:
        """Create or update the record; True when it was created. Never a second record."""
        for other in self.find_systems(mac_address=spec.mac):
            if other != spec.name:
                raise CobblerRejected(f"MAC {spec.mac} already belongs to Cobbler system {other!r}",
                                      operation="find_system", subject=spec.name)
        existing = self.get_system(spec.name)
        tok = self.token()
        if existing is None:
            handle = self._call("new_system", lambda: self._proxy.new_system(tok))
            self._modify(spec.name, handle, "name", spec.name)
        else:
            handle = self._call("get_system_handle",
                                lambda: self._proxy.get_system_handle(spec.name, tok), spec.name)
        self._modify(spec.name, handle, "profile", spec.profile)
        self._modify(spec.name, handle, "hostname", spec.hostname)
        self._modify(spec.name, handle, "modify_interface", spec.interface_fields())
        if spec.gateway:
            self._modify(spec.name, handle, "gateway", spec.gateway)
        self._modify(spec.name, handle, "autoinstall_meta", spec.autoinstall_meta)
        for key in BMC_FIELDS:
            if existing and existing.get(key):
                self._modify(spec.name, handle, key, "")
        self._modify(spec.name, handle, "netboot_enabled", True)
        self._confirmed(f"save_system {spec.name}",
                        self._call(f"save_system {spec.name}",
                                   lambda: self._proxy.save_system(handle, tok), spec.name),
                        f"system {spec.name!r} was not saved; see Cobbler's log", spec.name)
        return existing is None

    def set_autoinstall_meta(self, name: str, meta: dict[str, str]) -> None:
        """Replace the record's autoinstall_meta (no sync needed: Cobbler renders the profile
        when the installer fetches it)."""
        tok = self.token()
        handle = self._call("get_system_handle",
                            lambda: self._proxy.get_system_handle(name, tok), name)
        self._modify(name, handle, "autoinstall_meta", meta)
        self._confirmed(f"save_system {name}",
                        self._call(f"save_system {name}",
                                   lambda: self._proxy.save_system(handle, tok), name),
                        f"system {name!r} was not saved; see Cobbler's log", name)

    def forget_meta(self, name: str, keys: tuple[str, ...]) -> list[str]:
        """`keys` out of the record's autoinstall_meta, the others kept; returns the keys it
        held. A record already without them (or none) is not written: a rerun changes nothing."""
        meta = (self.get_system(name) or {}).get("autoinstall_meta")
        held = [k for k in keys if isinstance(meta, dict) and k in meta]
        if held and isinstance(meta, dict):
            self.set_autoinstall_meta(name, {k: v for k, v in meta.items() if k not in keys})
        return held

    def _modify(self, name: str, handle: str, key: str, value: Any) -> None:
        tok = self.token()
        ok = self._call(f"modify_system {key}",
                        lambda: self._proxy.modify_system(handle, key, value, tok), name)
        if ok is False:
            raise CobblerRejected(f"Cobbler refused system field {key!r}",
                                  operation="modify_system", subject=name)

    @staticmethod
    def _confirmed(what: str, answer: Any, why: str, name: str | None = None) -> None:
        """Some calls answer False, not a fault, when Cobbler did not do what was asked: going on
        would report done what was not (netboot still on, a host never power-cycled)."""
        if answer is False:
            raise CobblerRejected(f"Cobbler answered False to {what}: {why}",
                                  operation=what.split()[0], subject=name)

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
            {"systems": [name]}, tok), name)
        # a one-system sync takes tenths of a second: look again soon, and back off gently so
        # the end is seen at most about half the time waited so far after it
        for attempt in Retrying(stop=stop_after_delay(timeout),
                                wait=wait_exponential(multiplier=0.02, exp_base=1.5, max=2),
                                retry=retry_if_exception_type(_SyncRunning), reraise=True):
            with attempt:
                state = self._call(f"sync {name} status",
                                   lambda: self._proxy.get_task_status(task_id), name)[2]
                if state in ("notification", "running"):  # queued, then running
                    raise _SyncRunning(f"Cobbler sync of {name} still running after {timeout:.0f}s",
                                       operation="sync", subject=name)
                if state != "complete":
                    raise CobblerError(f"Cobbler sync of {name} ended {state!r}; see Cobbler's "
                                       f"log for task {task_id}", operation="sync", subject=name)

    def disable_netboot(self, name: str) -> None:
        tok = self.token()
        answer = self._call(f"disable_netboot {name}",
                            lambda: self._proxy.disable_netboot(name, tok), name)
        # Cobbler 3.3 answers False, and changes nothing, when its pxe_just_once setting is off
        # or the system is gone
        self._confirmed(f"disable_netboot {name}", answer,
                        f"netboot of system {name!r} is still on: set pxe_just_once: true in "
                        f"Cobbler's settings (restart cobblerd), or check the system exists "
                        f"(cobbler system report --name {name})", name)

    def sync_dhcp(self) -> None:
        """Rewrite the DHCP server's configuration from the records (a removed system's MAC
        leaves it); no PXE file is touched, so no machine's network boot is cut short."""
        tok = self.token()
        self._confirmed("sync_dhcp", self._call("sync_dhcp", lambda: self._proxy.sync_dhcp(tok)),
                        "the DHCP configuration was not rewritten; see Cobbler's log")

    def remove_system(self, name: str) -> bool:
        if self.get_system(name) is None:
            return False
        tok = self.token()
        self._confirmed(f"remove_system {name}",
                        self._call(f"remove_system {name}",
                                   lambda: self._proxy.remove_system(name, tok), name),
                        f"system {name!r} was not removed; see Cobbler's log", name)
        return True
