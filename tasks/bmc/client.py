"""A store host's BMC as step 2 uses it: read the power state, boot from the network once,
power off and on. Two implementations speak the BMC's own protocol: `IpmiBmc` (IPMI 2.0
lanplus, ipmitool) and `RedfishBmc` (Redfish, sushy); `power_cycle_for_install` is the one
sequence step 2 runs over either."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import SecretStr

from store_rollout.instrument import external

PowerState = Literal["on", "off"]


class BmcLogin:
    """What a client of either protocol holds: the login, the deadline of each call, and the
    store it powers (for messages)."""

    def __init__(self, username: str, password: SecretStr, timeout: float, store_id: str) -> None:
        self.username = username
        self._password = password
        self.timeout = timeout
        self.store_id = store_id


class Bmc(Protocol):
    """One store host's BMC. Every call has its own timeout and raises a `BmcError` naming the
    BMC and the store."""

    @property
    def label(self) -> str:
        """How messages name the BMC: the store, the protocol and the address."""
        ...

    def power_state(self) -> PowerState: ...

    def boot_from_network_once(self) -> None:
        """The next boot (only) is from the network, whatever the firmware's boot order."""
        ...

    def power_off(self) -> None:
        """Hard off, without waiting for the OS (the host is being reinstalled)."""
        ...

    def power_on(self) -> None: ...

    def shutdown(self) -> None:
        """Ask the OS to shut down (ACPI power button: IPMI soft off, Redfish
        GracefulShutdown); returns at once, the host goes off when its OS is done."""
        ...


def power_cycle_for_install(bmc: Bmc, off_seconds: float, log: Callable[[str], None],
                            before_on: Callable[[], None] = lambda: None) -> list[str]:
    """Boot the host from the network for its PXE install: network boot once, off when on
    (then `off_seconds` off), `before_on()`, on. Returns the actions taken, each with its reason
    (also logged)."""
    actions: list[str] = []

    def act(action: str, reason: str, call: Callable[[], None]) -> None:
        call()
        actions.append(action)
        log(f"{bmc.label}: {action} ({reason})")

    act("network boot once", "the next boot fetches Cobbler's PXE configuration",
        bmc.boot_from_network_once)
    if bmc.power_state() == "on":
        act("power off", "the running system stops for the reinstall", bmc.power_off)
        with external("hardware_wait"):
            time.sleep(off_seconds)
    before_on()
    act("power on", "the host boots from the network into the installer", bmc.power_on)
    return actions
