"""The pipeline's BMC clients against the lab's real emulators: VirtualBMC over IPMI 2.0
lanplus, sushy-tools over Redfish, both driving a store host's libvirt domain."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from lab.hardware import RackedHost, rack, unrack
from lab.state import LabInfo
from tasks.bmc import Bmc, BmcAuthFailed, IpmiBmc, RedfishBmc
from tests.helpers import power_actions, wait_for

pytestmark = pytest.mark.lab


def client(lab: LabInfo, host: RackedHost, password: str) -> Bmc:
    if host.power_type == "ipmi":
        assert host.power_port is not None
        return IpmiBmc(host.power_address, lab.bmc_user, SecretStr(password),
                       port=host.power_port, timeout=10, store_id=host.store_id)
    return RedfishBmc(host.power_address, lab.bmc_user, SecretStr(password),
                      system_id=host.redfish_system_id, timeout=10, store_id=host.store_id)


def domain_active(lab: LabInfo, name: str) -> bool:
    import libvirt

    conn = libvirt.openReadOnly(lab.libvirt_uri)
    try:
        return bool(conn.lookupByName(name).isActive())
    finally:
        conn.close()


@pytest.fixture(params=["ipmi", "redfish"])
def host(lab: LabInfo, request: pytest.FixtureRequest) -> Iterator[RackedHost]:
    store_id = f"bmc-{request.param}"
    racked = rack(lab, store_id, f"52:54:00:b3:00:0{'12'[request.param == 'redfish']}",
                  request.param)
    try:
        yield racked
    finally:
        unrack(lab, store_id)


def test_the_bmc_powers_its_host_domain_on_and_off(lab: LabInfo, host: RackedHost) -> None:
    bmc = client(lab, host, lab.bmc_password)
    before = power_actions(lab, host.system)  # this host may have been racked before
    assert bmc.power_state() == "off" and not domain_active(lab, host.system)
    bmc.boot_from_network_once()
    bmc.power_on()
    wait_for(lambda: domain_active(lab, host.system), timeout=20, what=f"{host.system} on")
    assert bmc.power_state() == "on"
    bmc.power_off()
    wait_for(lambda: not domain_active(lab, host.system), timeout=20, what=f"{host.system} off")
    assert bmc.power_state() == "off"
    # the emulator's own log is the record of what it did
    after = power_actions(lab, host.system)
    assert {k: after[k] - before[k] for k in after} == {"on": 1, "off": 1}
    for log in ("vbmcd-bmcs.log", "vbmcd.log", "redfish-bmc.log"):
        assert lab.bmc_password not in (Path(lab.state_dir) / "logs" / log).read_text(), log


def test_a_wrong_bmc_password_fails_naming_the_bmc_and_the_store(lab: LabInfo,
                                                                 host: RackedHost) -> None:
    wrong = lab.bmc_password[::-1]  # as long as the right one (IPMI takes at most 20 bytes)
    bmc = client(lab, host, wrong)
    with pytest.raises(BmcAuthFailed) as err:
        bmc.power_on()
    message = str(err.value)
    protocol = {"ipmi": "IPMI", "redfish": "Redfish"}[host.power_type]
    assert message.startswith(f"store {host.store_id}: {protocol} BMC {host.power_address}")
    assert host.power_address in message and f"user {lab.bmc_user!r}" in message
    assert "fix the BMC Credentials Block" in message
    assert wrong not in message and lab.bmc_password not in message
    assert not domain_active(lab, host.system)  # nothing changed


def test_lab_status_lists_the_racked_host_with_its_bmc_and_power(
        lab: LabInfo, lab_dir: Path, host: RackedHost) -> None:
    from typer.testing import CliRunner

    from app.cli import app

    def listed() -> dict[str, object]:
        result = CliRunner().invoke(app, ["lab", "status", "--state-dir", str(lab_dir), "--json"])
        assert result.exit_code == 0, result.output
        hosts = json.loads(result.output)["hosts"]
        return next(h for h in hosts if h["system"] == host.system)

    row = listed()
    assert (row["store_id"], row["mac"], row["on"]) == (host.store_id, host.mac, False)
    assert row["ipmi_port"] == host.power_port  # None for a host behind Redfish
    client(lab, host, lab.bmc_password).power_on()
    wait_for(lambda: listed()["on"], timeout=20, what=f"{host.system} listed on")
