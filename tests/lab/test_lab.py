"""Issue 2: every lab service really answers (no mocks of Salt, Cobbler, libvirt or Prefect)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
import xml.etree.ElementTree as ET
import xmlrpc.client
from pathlib import Path
from typing import Any

import pytest
import requests

from lab.prefect_access import PrefectAccess, api_session
from lab.state import LabInfo, LabPaths
from lab.store_network import BRIDGE, StoreNetwork
from store_rollout.platforms import PLATFORMS
from tasks.cobbler import CobblerClient, SystemSpec
from tasks.salt import SaltMasterClient
from tests.helpers import cli_in_process, events, wait_for

SLES15_PROFILE = PLATFORMS["sles15-xen"].cobbler_profile

pytestmark = pytest.mark.lab


def cobbler(lab: LabInfo) -> CobblerClient:
    return CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user, password=lab.cobbler_password)


def test_prefect_server_health_on_postgres(lab: LabInfo, lab_dir: Path) -> None:
    assert api_session(lab).get(f"{lab.prefect_api_url}/health", timeout=5).json() is True
    # the server's schema lives in the lab's PostgreSQL, not in SQLite
    secrets = json.loads((lab_dir / "secrets.json").read_text())
    port = json.loads((lab_dir / "ports.json").read_text())["postgres"]
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "-d", "prefect", "-tAc",
         "SELECT count(*) FROM information_schema.tables WHERE table_name = 'flow_run'"],
        env={**os.environ, "PGPASSWORD": secrets["postgres_password"]},
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert not list((lab_dir / "prefect-home").glob("*.db")), "Prefect fell back to SQLite"
    assert api_session(lab).get(lab.prefect_ui_url, timeout=5).status_code == 200  # the UI


def test_prefect_api_refuses_anyone_without_the_lab_credential(lab: LabInfo, lab_dir: Path,
                                                               lab_env: dict[str, str]) -> None:
    """Issue 44: the lab's Prefect API answers over TLS only and to its credential only; every
    client of the lab (this session, the CLI, the Salt forwarder) has it; it is in no log."""
    access = PrefectAccess.of(lab)
    url, ca = f"{lab.prefect_api_url}/flow_runs/filter", str(access.ca_file)
    user = access.auth_string.split(":", 1)[0]
    assert requests.post(url, json={}, verify=ca, timeout=5).status_code == 401
    assert requests.post(url, json={}, verify=ca, auth=(user, "not-the-password"),
                         timeout=5).status_code == 401
    with pytest.raises(requests.exceptions.SSLError):  # the lab CA is no public one
        requests.post(url, json={}, auth=(user, "x"), timeout=5)
    with pytest.raises(requests.ConnectionError):  # plain HTTP gets no answer at all
        requests.post(url.replace("https://", "http://"), json={}, timeout=5)
    assert isinstance(api_session(lab).post(url, json={"limit": 1}, timeout=5).json(), list)
    # the CLI of a user who exported only the settings file: it names the credential's file
    status = cli_in_process(lab_env, "status", "--json")
    assert status.exit_code == 0, status.stdout + str(status.exception)
    assert "runs" in json.loads(status.stdout)
    # the Salt forwarder engine logs in too: a store event on the master's bus reaches Prefect
    probe = f"probe{uuid.uuid4().hex[:6]}"
    SaltMasterClient(lab.salt_master_config).fire(f"store/auth-probe/{probe}",
                                                  {"id": f"store-{probe}-hv"})
    wait_for(lambda: events(lab, f"salt.store.auth-probe.{probe}", f"salt.minion.store-{probe}-hv"),
             timeout=20, interval=0.5, what="the forwarded Salt event in Prefect")
    # the credential: a 0600 file; not in the settings file, lab.json, the master's config or
    # any log of the lab
    assert access.auth_file.stat().st_mode & 0o777 == 0o600
    secret = access.auth_string.split(":", 1)[1]
    for path in [LabPaths(lab_dir).settings_file, LabPaths(lab_dir).lab_json,
                 Path(lab.salt_master_config), *LabPaths(lab_dir).logs.rglob("*")]:
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), f"the credential is in {path}"


def test_erp_receiver_records_post(lab: LabInfo) -> None:
    key = f"test-{uuid.uuid4()}"
    resp = requests.post(f"{lab.erp_url}/api/v1/store-rollouts",
                         json={"store_id": "test-erp"},
                         headers={"Authorization": f"Bearer {lab.erp_token}",
                                  "Idempotency-Key": key}, timeout=5)
    assert resp.status_code == 201
    again = requests.post(f"{lab.erp_url}/api/v1/store-rollouts", json={"store_id": "test-erp"},
                          headers={"Authorization": f"Bearer {lab.erp_token}",
                                   "Idempotency-Key": key}, timeout=5)
    assert again.status_code == 200 and again.json()["id"] == resp.json()["id"]
    records = [json.loads(line) for line in Path(lab.erp_log).read_text().splitlines()]
    mine = [r for r in records if r["idempotency_key"] == key]
    assert [r["status"] for r in mine] == [201, 200]
    assert mine[0]["payload"] == {"store_id": "test-erp"}


def test_erp_receiver_fault_injection(lab: LabInfo, faults: Any) -> None:
    faults("erp", {"status": 503, "count": 2})
    headers = {"Authorization": f"Bearer {lab.erp_token}"}
    codes = [requests.post(f"{lab.erp_url}/api/v1/store-rollouts", json={"store_id": "f"},
                           headers=headers, timeout=5).status_code for _ in range(3)]
    assert codes == [503, 503, 201]
    faults("erp", {"drop": True, "count": 1})
    with pytest.raises(requests.ConnectionError):
        requests.post(f"{lab.erp_url}/api/v1/store-rollouts", json={"store_id": "f"},
                      headers=headers, timeout=5)


def test_cobbler_system_round_trip(lab: LabInfo) -> None:
    client = cobbler(lab)
    assert client.version() >= 3.3
    assert client.profile_exists(SLES15_PROFILE)
    spec = SystemSpec(name="roundtrip-hv", hostname="roundtrip-hv.lab.invalid",
                      mac="52:54:00:aa:00:01", profile=SLES15_PROFILE, ip="192.0.2.50",
                      netmask="255.255.255.0", autoinstall_meta={"minion_id": "roundtrip-hv"})
    try:
        assert client.upsert_system(spec) is True
        assert client.upsert_system(spec) is False  # update, not a second record
        record = client.get_system("roundtrip-hv")
        assert record is not None and record["interfaces"]["eth0"]["mac_address"] == spec.mac
        assert client.find_systems(mac_address=spec.mac) == ["roundtrip-hv"]
        assert "roundtrip-hv" in client.render_autoinstall("roundtrip-hv")
    finally:
        client.remove_system("roundtrip-hv")
    assert client.get_system("roundtrip-hv") is None


def test_cobbler_refuses_default_credentials(lab: LabInfo) -> None:
    proxy = xmlrpc.client.ServerProxy(lab.cobbler_url, allow_none=True)
    with pytest.raises(xmlrpc.client.Fault, match="login failed"):
        proxy.login("cobbler", "cobbler")


TINY_DOMAIN = """<domain type='qemu'>
  <name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='bridge'><source bridge='storebr0'/><model type='virtio'/></interface>
    <serial type='pty'/><console type='pty'/></devices>
</domain>"""


def test_libvirt_define_start_destroy(lab: LabInfo) -> None:
    import libvirt

    conn = libvirt.open(lab.libvirt_uri)
    name = f"lab-tiny-{uuid.uuid4().hex[:6]}"
    dom = conn.defineXML(TINY_DOMAIN.format(name=name))
    try:
        dom.create()
        assert dom.isActive() == 1
        pid_file = Path(lab.state_dir) / "libvirt" / "ns" / "run" / "libvirt" / "qemu" / f"{name}.pid"
        assert pid_file.exists()  # QEMU's runtime state is in the lab dir, not the host's /run
        # the NIC's tap is on the store network's bridge, in its namespace, not on the host
        tap = ET.fromstring(dom.XMLDesc(0)).find("./devices/interface/target").get("dev")
        network = StoreNetwork.load(Path(lab.store_network_state))
        on_bridge = network.run(["ip", "-o", "link", "show", "master", BRIDGE],
                                capture_output=True, text=True, check=True).stdout
        assert f" {tap}:" in on_bridge or f" {tap}@" in on_bridge, on_bridge
        assert tap not in [name for _index, name in socket.if_nameindex()]
        dom.destroy()
        assert dom.isActive() == 0
    finally:
        if dom.isActive():
            dom.destroy()
        dom.undefine()
        conn.close()


def test_hypervisor_powered_on_by_its_bmc_installs_through_cobbler_and_answers_salt_ping(
        lab: LabInfo) -> None:
    """A racked host, its record in Cobbler, its BMC (IPMI) powers it on -> simulated PXE
    install -> minion -> autosign -> ping; off again, its minion stops with it."""
    from pydantic import SecretStr

    from lab.hardware import rack, unrack
    from tasks.bmc import IpmiBmc

    client = cobbler(lab)
    master = SaltMasterClient(lab.salt_master_config)
    host = rack(lab, "labtest", "52:54:00:aa:00:02", "ipmi")
    minion_id = host.system
    master.delete_key(minion_id)
    token = master.issue_token(minion_id)
    spec = SystemSpec(
        name=minion_id, hostname=f"{minion_id}.lab.invalid", mac=host.mac,
        profile=SLES15_PROFILE,
        autoinstall_meta={"salt_master": lab.salt_master_address,
                          "salt_master_port": str(lab.salt_ret_port),
                          "salt_publish_port": str(lab.salt_publish_port),
                          "minion_id": minion_id, "store_id": "labtest",
                          "autosign_grain": "store_rollout_token", "autosign_token": token,
                          "virt_uri": lab.libvirt_uri, "vm_images_dir": lab.vm_images_dir})
    assert host.power_port is not None
    bmc = IpmiBmc(host.power_address, lab.bmc_user, SecretStr(lab.bmc_password),
                  port=host.power_port, store_id="labtest")
    try:
        with master.subscribe("salt/minion/") as bus:
            client.upsert_system(spec)
            client.sync_system(minion_id)
            bmc.power_on()
            master.wait_for_event(bus, lambda e: e.tag == f"salt/minion/{minion_id}/start",
                                  timeout=60, what=f"start of {minion_id}")
        assert bmc.power_state() == "on"
        assert master.ping(minion_id)
        assert master.key_state(minion_id) == "accepted"
        # the AutoYaST end-of-install step reached Cobbler: netboot is off now
        record = client.get_system(minion_id)
        assert record is not None and record["netboot_enabled"] is False
        assert master.cmd(minion_id, "grains.get", ["role"]) == "hypervisor"
        # the virt settings reached the host through the profile, as on a real host
        assert master.cmd(minion_id, "config.get", ["virt:connection:uri"]) == lab.libvirt_uri
        assert master.cmd(minion_id, "config.get", ["virt:images"]) == lab.vm_images_dir
        bmc.power_off()
        wait_for(lambda: minion_id not in requests.get(f"{lab.simulator_url}/minions",
                                                       timeout=5).json()["running"],
                 timeout=10, what=f"{minion_id}'s minion to stop with its machine")
    finally:
        master.revoke_token(minion_id)
        unrack(lab, "labtest")
        client.remove_system(minion_id)
        master.delete_key(minion_id)

