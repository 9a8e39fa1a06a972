"""Redfish to a store host's BMC, through sushy (OpenStack's Redfish library): the system's power
state, a one-time PXE boot override, ForceOff and On."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import SecretStr

from store_rollout.instrument import external
from store_rollout.transport import checked_url
from tasks.bmc.client import BmcLogin, PowerState
from tasks.bmc.errors import BmcAuthFailed, BmcError, BmcRejected, BmcUnreachable

T = TypeVar("T")

# sushy retries a 5xx answer 10 times, 3 s apart, and an unanswered request 3 times, 2 s apart,
# by default (0 means its default): one try each, the task's retry is the retry layer
SERVER_SIDE_RETRIES = 1


class RedfishBmc(BmcLogin):
    def __init__(self, url: str, username: str, password: SecretStr, *,
                 system_id: str | None = None, timeout: float = 20.0, verify: bool | str = True,
                 store_id: str = "", insecure_http: bool = False) -> None:
        """`verify`: check the BMC's certificate (True), against a CA bundle (its path), or not
        (False); `insecure_http`: the setting insecure_redfish_http (store_rollout/transport.py)."""
        checked_url(url, "redfish", f"store {store_id}: hypervisor.power_address", insecure_http)
        super().__init__(username, password, timeout, store_id)
        self.url, self.system_id, self.verify = url.rstrip("/"), system_id, verify
        self._system: Any = None

    @property
    def label(self) -> str:
        which = f" system {self.system_id}" if self.system_id else ""
        return f"store {self.store_id}: Redfish BMC {self.url}{which}"

    def __repr__(self) -> str:
        return f"RedfishBmc({self.url!r}, system_id={self.system_id!r}, user={self.username!r})"

    def power_state(self) -> PowerState:
        def read(system: Any) -> str:
            system.refresh(force=True)
            return str(getattr(system.power_state, "value", system.power_state))

        state = self._run("power status", read)
        # PoweringOn/PoweringOff count as where they are going
        return "on" if state in ("On", "PoweringOn") else "off"

    def boot_from_network_once(self) -> None:
        import sushy

        self._run("set boot device", lambda system: system.set_system_boot_options(
            target=sushy.BootSource.PXE, enabled=sushy.BootSourceOverrideEnabled.ONCE))

    def power_off(self) -> None:
        import sushy

        self._run("power off", lambda system: system.reset_system(sushy.ResetType.FORCE_OFF))

    def power_on(self) -> None:
        import sushy

        self._run("power on", lambda system: system.reset_system(sushy.ResetType.ON))

    def shutdown(self) -> None:
        import sushy

        self._run("graceful shutdown", lambda system: system.reset_system(
            sushy.ResetType.GRACEFUL_SHUTDOWN))

    def _connect(self) -> Any:
        if self._system is None:
            import sushy
            from sushy.auth import BasicAuth

            root = sushy.Sushy(self.url, verify=self.verify,
                               auth=BasicAuth(self.username, self._password.get_secret_value()),
                               read_timeout=self.timeout, connect_timeout=min(self.timeout, 5.0),
                               server_side_retries=SERVER_SIDE_RETRIES,
                               server_side_retries_delay=1)
            identity = (f"/redfish/v1/Systems/{self.system_id}" if self.system_id else None)
            self._system = root.get_system(identity)
        return self._system

    def _run(self, what: str, call: Callable[[Any], T]) -> T:
        import requests
        import sushy.exceptions as sushy_errors

        try:
            with external("bmc"):
                return call(self._connect())
        except sushy_errors.AccessError as exc:
            raise BmcAuthFailed(f"{self.label} refused the login of user {self.username!r} "
                                f"(HTTP {exc.status_code}): fix the BMC Credentials Block of "
                                "this store", operation=what, subject=self.label,
                                status=exc.status_code) from None
        except sushy_errors.ResourceNotFoundError as exc:
            raise BmcRejected(f"{self.label} has no such system (HTTP 404 during {what}): set "
                              "hypervisor.redfish_system_id to one of the BMC's systems",
                              operation=what, subject=self.label, status=404) from exc
        except sushy_errors.UnknownDefaultError as exc:
            raise BmcRejected(f"{self.label} manages several systems: set "
                              f"hypervisor.redfish_system_id ({exc})", operation=what,
                              subject=self.label) from None
        except (sushy_errors.ConnectionError, requests.exceptions.ConnectionError,
                requests.exceptions.Timeout) as exc:
            raise BmcUnreachable(f"{self.label} did not answer {what} within "
                                 f"{self.timeout:.0f} s: {exc}", operation=what,
                                 subject=self.label) from None
        except sushy_errors.HTTPError as exc:
            error: BmcError = (BmcUnreachable if exc.status_code >= 500 else BmcRejected)(
                f"{self.label} refused {what}: HTTP {exc.status_code} {exc.detail}",
                operation=what, subject=self.label, status=exc.status_code)
            raise error from None
        except sushy_errors.SushyError as exc:
            raise BmcRejected(f"{self.label}: {what} failed: {exc}", operation=what,
                              subject=self.label) from None
