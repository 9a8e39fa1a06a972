"""Step 2's power path (tasks/bmc/): the sequence over any BMC, and what each protocol's client
says when the BMC does not answer. The lab's real emulators are in tests/lab/test_bmc_lab.py."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from pydantic import SecretStr

from tasks.bmc import BmcUnreachable, IpmiBmc, RedfishBmc, power_cycle_for_install
from tasks.bmc.client import PowerState


class FakeBmc:
    label = "store 0042: IPMI BMC 10.0.0.9:623"

    def __init__(self, state: PowerState, fail_off: bool = False) -> None:
        self.state: PowerState = state
        self.fail_off = fail_off
        self.calls: list[tuple[str, float]] = []

    def power_state(self) -> PowerState:
        self.calls.append(("status", time.monotonic()))
        return self.state

    def boot_from_network_once(self) -> None:
        self.calls.append(("boot once", time.monotonic()))

    def power_off(self) -> None:
        if self.fail_off:
            raise BmcUnreachable("no answer", operation="power off", subject=self.label)
        self.calls.append(("off", time.monotonic()))
        self.state = "off"

    def power_on(self) -> None:
        self.calls.append(("on", time.monotonic()))
        self.state = "on"


def cycle(bmc: FakeBmc, off_seconds: float = 0.0) -> tuple[list[str], list[str], list[str]]:
    said: list[str] = []
    marked: list[str] = []
    actions = power_cycle_for_install(bmc, off_seconds, said.append,
                                      before_on=lambda: marked.append(bmc.calls[-1][0]))
    return actions, said, marked


def test_a_running_host_is_booted_from_the_network_off_then_on() -> None:
    bmc = FakeBmc("on")
    actions, said, marked = cycle(bmc, off_seconds=0.2)
    assert [c for c, _ in bmc.calls] == ["boot once", "status", "off", "on"]
    assert actions == ["network boot once", "power off", "power on"]
    assert marked == ["off"]  # the rerun's evidence is written after off, before on
    (_, off_at), (_, on_at) = bmc.calls[2], bmc.calls[3]
    assert on_at - off_at >= 0.2
    # each action logged with its reason, naming the BMC
    assert said == [
        "store 0042: IPMI BMC 10.0.0.9:623: network boot once (the next boot fetches Cobbler's "
        "PXE configuration)",
        "store 0042: IPMI BMC 10.0.0.9:623: power off (the running system stops for the "
        "reinstall)",
        "store 0042: IPMI BMC 10.0.0.9:623: power on (the host boots from the network into the "
        "installer)"]


def test_a_host_that_is_off_is_only_powered_on() -> None:
    bmc = FakeBmc("off")
    actions, _, marked = cycle(bmc, off_seconds=5)
    assert actions == ["network boot once", "power on"]
    assert [c for c, _ in bmc.calls] == ["boot once", "status", "on"]
    assert marked == ["status"]


def test_a_failed_power_off_powers_nothing_on_and_marks_nothing() -> None:
    bmc = FakeBmc("on", fail_off=True)
    with pytest.raises(BmcUnreachable):
        cycle(bmc)
    assert [c for c, _ in bmc.calls] == ["boot once", "status"]


def unused_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unused_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("make", [
    lambda: IpmiBmc("127.0.0.1", "admin", SecretStr("s3cret"), port=unused_udp_port(),
                    timeout=2, store_id="0042"),
    lambda: RedfishBmc(f"http://127.0.0.1:{unused_tcp_port()}", "admin", SecretStr("s3cret"),
                       system_id="1", timeout=2, store_id="0042"),
], ids=["ipmi", "redfish"])
def test_a_bmc_that_does_not_answer_fails_within_its_timeout_naming_it(make: Any) -> None:
    bmc = make()
    started = time.monotonic()
    with pytest.raises(BmcUnreachable) as err:
        bmc.power_state()
    assert time.monotonic() - started < 2 + 1.5
    assert str(err.value).startswith(f"{bmc.label} did not answer power status")
    assert bmc.label.startswith("store 0042: ")
    assert err.value.operation == "power status" and err.value.subject == bmc.label
    assert "s3cret" not in str(err.value) + repr(bmc)


FAKE_IPMITOOL = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/argv"
printf '%s' "$IPMI_PASSWORD" > "$(dirname "$0")/password"
cat "$(dirname "$0")/stdout"
cat "$(dirname "$0")/stderr" >&2
exit "$(cat "$(dirname "$0")/rc")"
"""


@pytest.fixture
def ipmitool(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stand-in ipmitool that answers what the test writes and records how it was called."""
    from tasks.bmc import ipmi

    tool = tmp_path / "ipmitool"
    tool.write_text(FAKE_IPMITOOL)
    tool.chmod(0o755)
    monkeypatch.setattr(ipmi, "IPMITOOL", str(tool))

    def answer(stdout: str = "", stderr: str = "", rc: int = 0) -> None:
        for name, text in (("stdout", stdout), ("stderr", stderr), ("rc", str(rc))):
            (tmp_path / name).write_text(text)

    answer.dir = tmp_path  # type: ignore[attr-defined]
    return answer


def test_ipmitool_gets_the_password_in_its_environment_only(ipmitool: Any) -> None:
    ipmitool(stdout="Loading IANA PEN Registry...\nChassis Power is on\n")
    bmc = IpmiBmc("10.0.0.9", "admin", SecretStr("s3cret"), port=6230, store_id="0042",
                  cipher_suite=3)
    assert bmc.power_state() == "on"
    argv = (ipmitool.dir / "argv").read_text().split()
    assert "s3cret" not in argv and (ipmitool.dir / "password").read_text() == "s3cret"
    assert argv[argv.index("-E") - 2:argv.index("-E")] == ["-U", "admin"]
    assert argv[argv.index("-C"):argv.index("-C") + 2] == ["-C", "3"]
    assert argv[-3:] == ["chassis", "power", "status"] and "-R" in argv  # one try
    ipmitool(stdout="Chassis Power is off\n")
    assert bmc.power_state() == "off"


@pytest.mark.parametrize(("stderr", "error", "said"), [
    ("> RAKP 2 HMAC is invalid\nError: Unable to establish IPMI v2 / RMCP+ session\n",
     "BmcAuthFailed", "refused the login of user 'admin' (RAKP 2 HMAC is invalid; Error: "
                      "Unable to establish IPMI v2 / RMCP+ session; *****): fix the BMC "
                      "Credentials Block of this store"),
    ("Get Auth Capabilities error\nError: Unable to establish IPMI v2 / RMCP+ session\n",
     "BmcUnreachable", "did not answer power on: Get Auth Capabilities error; Error: Unable to "
                       "establish IPMI v2 / RMCP+ session; *****"),
    ("Set Chassis Power Control to On failed: Invalid command\n", "BmcRejected",
     "refused power on: Set Chassis Power Control to On failed: Invalid command; *****"),
])
def test_ipmitool_failures_are_told_apart_naming_the_bmc(ipmitool: Any, stderr: str,
                                                         error: str, said: str) -> None:
    ipmitool(stderr=stderr + "s3cret\n", rc=1)  # a tool that echoed the password: masked
    bmc = IpmiBmc("10.0.0.9", "admin", SecretStr("s3cret"), store_id="0042")
    with pytest.raises(Exception) as err:
        bmc.power_on()
    assert type(err.value).__name__ == error
    assert str(err.value) == "store 0042: IPMI BMC 10.0.0.9:623 " + said
    assert "s3cret" not in str(err.value)


def test_an_ipmi_password_longer_than_ipmi_takes_is_refused_before_any_call(
        ipmitool: Any) -> None:
    bmc = IpmiBmc("10.0.0.9", "admin", SecretStr("x" * 21), store_id="0042")
    with pytest.raises(Exception, match="longer than IPMI 2.0's 20 bytes") as err:
        bmc.power_state()
    assert type(err.value).__name__ == "BmcAuthFailed"
    assert not (ipmitool.dir / "argv").exists()
