"""IPMI 2.0 (lanplus) to a store host's BMC, through `ipmitool` (Debian's package; what
OpenStack Ironic's default IPMI driver runs).

ipmitool picks the strongest cipher suite the BMC offers unless one is given
(`hypervisor.ipmi_cipher_suite`, for a BMC that offers one it does not take, as Ironic's
`ipmi_cipher_suite`); the password reaches it in its environment (`-E`), never on its command
line; each call is one try under an explicit deadline.
pyghmi was tried first: its client takes for granted that the BMC accepted the cipher suite it
proposed, and fails on a BMC that answers with another (VirtualBMC does).
"""

from __future__ import annotations

import os
import subprocess

from pydantic import SecretStr

from store_rollout.instrument import external
from tasks.bmc.client import BmcLogin, PowerState
from tasks.bmc.errors import BmcAuthFailed, BmcError, BmcRejected, BmcUnreachable

IPMI_PORT = 623
# IPMI 2.0 keys a session with the password in a 20-byte field (RAKP): a longer one cannot log in
IPMI_PASSWORD_MAX_BYTES = 20
IPMITOOL = "ipmitool"  # Debian's, on PATH
# ipmitool -v's words for a login the BMC refused (RAKP 2's HMAC: a wrong password; RAKP 2/4
# status codes: an unknown user or a role it may not take)
_AUTH_REFUSED = ("rakp 2 hmac is invalid", "unauthorized name", "invalid role",
                 "unauthorized role", "invalid name length", "insufficient resources for session",
                 "no response from rakp 1", "no response from rakp 3")
_NO_ANSWER = ("get auth capabilities error", "no response", "connection refused",
              "unable to get channel cipher suites")


class IpmiBmc(BmcLogin):
    def __init__(self, address: str, username: str, password: SecretStr, *,
                 port: int = IPMI_PORT, timeout: float = 20.0, store_id: str = "",
                 cipher_suite: int | None = None) -> None:
        super().__init__(username, password, timeout, store_id)
        self.address, self.port, self.cipher_suite = address, port, cipher_suite

    @property
    def label(self) -> str:
        return f"store {self.store_id}: IPMI BMC {self.address}:{self.port}"

    def __repr__(self) -> str:
        return f"IpmiBmc({self.address!r}, port={self.port}, user={self.username!r})"

    def power_state(self) -> PowerState:
        said = self._run("power status", "chassis", "power", "status")
        if said.endswith(" on"):
            return "on"
        if said.endswith(" off"):
            return "off"
        raise BmcRejected(f"{self.label} answered power status with {said!r}",
                          operation="power status", subject=self.label)

    def boot_from_network_once(self) -> None:
        # without options=persistent the BMC clears it after the next boot
        self._run("set boot device", "chassis", "bootdev", "pxe")

    def power_off(self) -> None:
        self._run("power off", "chassis", "power", "off")

    def power_on(self) -> None:
        self._run("power on", "chassis", "power", "on")

    def shutdown(self) -> None:
        self._run("soft power off", "chassis", "power", "soft")

    def _run(self, what: str, *command: str) -> str:
        """ipmitool's last line of output; a failure mapped to a BmcError naming the BMC."""
        password = self._password.get_secret_value()
        if len(password.encode()) > IPMI_PASSWORD_MAX_BYTES:
            raise BmcAuthFailed(f"{self.label}: the password of user {self.username!r} is longer "
                                f"than IPMI 2.0's {IPMI_PASSWORD_MAX_BYTES} bytes: set a shorter "
                                "one on the BMC and in its BMC Credentials Block",
                                operation=what, subject=self.label)
        suite = [] if self.cipher_suite is None else ["-C", str(self.cipher_suite)]
        # one try (-R 1), as long as the deadline allows (-N): ipmitool's own retry resent a
        # power off whose answer was slow (a BMC carries out each request it gets), and the
        # task's retry is the retry layer
        argv = [IPMITOOL, "-v", "-I", "lanplus", "-H", self.address, "-p", str(self.port),
                "-U", self.username, "-E", *suite, "-N", str(max(1, int(self.timeout) - 1)),
                "-R", "1", *command]
        try:
            with external("bmc"):
                done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                                      env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                           "IPMI_PASSWORD": password}, check=False)
        except subprocess.TimeoutExpired:
            raise BmcUnreachable(f"{self.label} did not answer {what} within "
                                 f"{self.timeout:.0f} s (check the address, the port and that "
                                 "IPMI over LAN is enabled)", operation=what,
                                 subject=self.label) from None
        except FileNotFoundError:
            raise BmcError(f"{self.label}: {what} needs ipmitool on the worker (Debian package "
                           "ipmitool)", operation=what, subject=self.label) from None
        if done.returncode != 0:
            raise self._error(what, done.stderr.replace(password, "*****"))
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def _error(self, what: str, stderr: str) -> BmcError:
        said = [line.strip("> ").strip() for line in stderr.splitlines()
                if line.strip() and not line.startswith(("Loading IANA", "Using best"))]
        text = "; ".join(dict.fromkeys(said)) or "no answer"
        lowered = text.lower()
        if any(marker in lowered for marker in _AUTH_REFUSED):
            return BmcAuthFailed(f"{self.label} refused the login of user {self.username!r} "
                                 f"({text}): fix the BMC Credentials Block of this store",
                                 operation=what, subject=self.label)
        if any(marker in lowered for marker in _NO_ANSWER):
            return BmcUnreachable(f"{self.label} did not answer {what}: {text}",
                                  operation=what, subject=self.label)
        return BmcRejected(f"{self.label} refused {what}: {text}", operation=what,
                           subject=self.label)
