"""Issue 3: the store rollout end to end in the lab, checked on the real systems."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from lab.approvers import code_args
from lab.hardware import lab_serial
from lab.prefect_access import api_session
from lab.state import VENV_BIN, LabInfo, LabPaths, flow_settings
from lab.store_network import GATEWAY, NETWORK, StoreNetwork
from store_rollout.contracts import DATA_DISK_FILE, DATA_DISK_MOUNT
from tasks.cobbler import CobblerClient
from tasks.salt import SaltCommandFailed, SaltMasterClient
from tests.helpers import (
    bmc_power,
    check_store,
    cli_in_process,
    created_erp_notices,
    finish,
    power_actions,
    pxe_config_name,
    start_rollout,
    tftp_sent,
    wait_for,
    write_inventory,
)

pytestmark = pytest.mark.lab


def test_one_store_then_two_at_once(lab: LabInfo, lab_env: dict[str, str], tmp_path: Path) -> None:
    # e2e4 is never rolled out: the store staging refuses. e2e1 is behind an LTE link
    # (lab/wan.py) and its image carries a payload no other test's has, so its step 5 downloads
    # it over that link
    inventory = write_inventory(tmp_path / "inventory.yaml", ["e2e1", "e2e2", "e2e3", "e2e4"],
                                lab=lab, link={"e2e1": "lte"})
    shaped_env = {**lab_env, "STORE_ROLLOUT_IMAGE_PARAMS": json.dumps({
        **json.loads(flow_settings(lab, Path(lab.state_dir))["STORE_ROLLOUT_IMAGE_PARAMS"]),
        "LAB_PAYLOAD_MIB": "8"})}
    first = finish(start_rollout(shaped_env, "e2e1", inventory))
    assert first["state"] == "Completed"
    check_transfer_at_the_links_rate(lab, first)
    # each stage event says which boot it ran in (the simulated guest shares the host's kernel,
    # so one id; the full lab's test sees three) and when each minion start came
    assert set(first["firstboot"]["boot_ids"]) == {"started", "highstate", "done"}, first
    # two reboots seen; the first start may come before step 6 listens
    assert len(first["firstboot"]["minion_starts"]) == first["firstboot"]["boots_seen"] >= 2

    # then two at once, rolled out while the first store is checked (its power cut included):
    # a finished store's checks and the rollouts of others do not disturb each other, and the
    # checks' waits are spent on the rollouts. e2e2 as a user who only exported
    # STORE_ROLLOUT_SETTINGS_FILE: its flow runs in a worker thread of the CLI and must still report
    # to the lab's server, not to a temporary one
    # (the API's URL, CA and credential file too: the settings file names them)
    bare_env = {k: v for k, v in lab_env.items() if k not in (
        "PREFECT_API_URL", "PREFECT_HOME", "PREFECT_API_AUTH_STRING", "PREFECT_API_SSL_CERT_FILE")}
    procs = [start_rollout(bare_env, "e2e2", inventory), start_rollout(lab_env, "e2e3", inventory)]

    check_store(lab, "e2e1", first)
    check_cobbler_keeps_no_install_secrets(lab, "e2e1")
    check_defined_as_vm_xml_says(lab, inventory, "e2e1")
    check_image_server_answers_ranges_on_the_store_network(lab, first["image_key"])
    check_staging(shaped_env, inventory, first)  # the image of e2e1's payload
    check_hypervisor_sees_no_orchestrator_state(lab, "e2e1", first["image_key"])
    check_machines_on_the_store_network(lab, "e2e1")
    check_salt_events_in_prefect(lab, "e2e1")
    check_store_comes_back_after_a_power_cut(lab, lab_env, inventory, "e2e1")
    # without PREFECT_API_URL the CLI finds the lab's server through STORE_ROLLOUT_SETTINGS_FILE
    status = subprocess.run([str(VENV_BIN / "store-rollout"), "status", "--json"], env=bare_env,
                            capture_output=True, text=True, timeout=120)
    assert {"name": "rollout-e2e1", "state": "Completed"}.items() <= next(
        r for r in json.loads(status.stdout)["runs"] if r["name"] == "rollout-e2e1").items()

    results = [finish(p) for p in procs]
    for sid, result in zip(("e2e2", "e2e3"), results, strict=True):
        check_store(lab, sid, result)
    runs = api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": ["rollout-e2e2"]}}}, timeout=10).json()
    assert [r["state_type"] for r in runs] == ["COMPLETED"], runs

    # the hosts' extensions are the master's after their highstates: no step 4 synced any
    assert [r["hypervisor_extensions_synced"] for r in (first, *results)] == [[], [], []]
    # step 2 powered each host through its own BMC, e2e1 and e2e3 over IPMI, e2e2 over Redfish:
    # the host was off, so network boot once and on; the emulators' logs say it was once each
    assert [r["hypervisor_power_actions"] for r in (first, *results)] == \
        [["network boot once", "power on"]] * 3
    raw = yaml.safe_load(inventory.read_text())["stores"]
    assert [s["hypervisor"]["power_type"] for s in raw[:3]] == ["ipmi", "redfish", "ipmi"]
    for sid in ("e2e2", "e2e3"):  # e2e1 is powered off and on again by its power cut
        assert power_actions(lab, f"store-{sid}-hv") == {"on": 1, "off": 0}
    # each host's firmware took Cobbler's per-MAC PXELINUX configuration over TFTP from the
    # store network (the default lab's firmware asks at the gateway), and Cobbler wrote each
    # MAC into the DHCP server's configuration
    dnsmasq_conf = (LabPaths(Path(lab.state_dir)).cobbler / "etc" / "u" / "dnsmasq.conf").read_text()
    for entry in raw[:3]:
        mac = entry["hypervisor"]["mac"]
        assert GATEWAY in tftp_sent(lab, pxe_config_name(mac)), mac
        assert f"dhcp-host=net:x86_64,{mac}," in dnsmasq_conf
    # a host whose storevirt is not the master's (a project update since its install) has it
    # synced by the rerun's step 4, which found it out in the job it asks the domain with
    master = SaltMasterClient(lab.salt_master_config)
    extmods = master.cmd("store-e2e1-hv", "config.get", ["extension_modules"])
    master.cmd("store-e2e1-hv", "file.append", [f"{extmods}/modules/storevirt.py",
                                                "# from an older project version"])
    # a rerun of a finished store changes nothing: no second record, VM, key or ERP notice
    again = finish(start_rollout(shaped_env, "e2e1", inventory))  # its image: with the payload
    assert again["hypervisor_extensions_synced"] == ["modules.storevirt"], again
    assert again["vm"]["reused"] is True and again["erp_id"] == first["erp_id"]
    assert first["hypervisor_reinstalled"] is True and again["hypervisor_reinstalled"] is False
    check_store(lab, "e2e1", again)
    # every host reported the serial on its label (its domain's SMBIOS, read by Salt's grain)
    assert [r["hypervisor_serial"] for r in (first, *results)] == [
        lab_serial(s["hypervisor"]["mac"]) for s in raw[:3]]
    check_another_box_stops_at_step_3(lab, lab_env, inventory, "e2e2")
    check_decommission_leaves_nothing(lab, lab_env, inventory, "e2e3")
    check_a_destroyed_box_is_replaced(lab, lab_env, inventory, "e2e2")


def check_cobbler_keeps_no_install_secrets(lab: LabInfo, store_id: str) -> None:
    """After the rollout the store's Cobbler record holds neither the host's one-time token
    nor its root password's hash, and its profile renders without them; it pins the master's
    key (the lab host's real minion checked it: the rollout passed)."""
    from lab.autoyast import parse_autoyast
    from store_rollout.contracts import AUTOSIGN_GRAIN, ROOT_PASSWORD_HASH_META
    from tasks.salt.master_key import master_pin

    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    hv = f"store-{store_id}-hv"
    meta = cobbler.get_system(hv)["autoinstall_meta"]
    assert not {"autosign_token", ROOT_PASSWORD_HASH_META} & set(meta), meta
    master = SaltMasterClient(lab.salt_master_config)
    assert {k: meta.get(k) for k in master_pin(master.opts)} == master_pin(master.opts)
    rendered = cobbler.render_autoinstall(hv)
    minion = yaml.safe_load(
        parse_autoyast(rendered).files["/etc/salt/minion.d/50-store-rollout.conf"])
    assert minion["grains"][AUTOSIGN_GRAIN] == "" and "$6$" not in rendered
    assert minion["master_finger"] == master_pin(master.opts)["master_finger"]


def check_a_destroyed_box_is_replaced(lab: LabInfo, lab_env: dict[str, str], inventory: Path,
                                      store_id: str) -> None:
    """The store's host destroyed (its domain and its Redfish system gone), a new box racked
    with another MAC: `replace` installs it, creates the store VM on it, moves the one Cobbler
    record, replaces the old key, tells the ERP; reconcile with the new box written in is ok."""
    from lab.hardware import rack, unrack

    hv = f"store-{store_id}-hv"
    raw = yaml.safe_load(inventory.read_text())
    entry = next(s for s in raw["stores"] if s["store_id"] == store_id)
    old_mac, new_mac = entry["hypervisor"]["mac"], "52:54:00:e2:0a:02"
    master = SaltMasterClient(lab.salt_master_config)
    old_key = master.fingerprints(hv)["minions"]
    unrack(lab, store_id)
    box = rack(lab, store_id, new_mac, "redfish", name=f"{hv}-new")
    fields = {"mac": new_mac, **box.inventory_fields()}
    options = {"mac": "--mac", "power_type": "--power-type", "power_address": "--bmc-address",
               "redfish_system_id": "--redfish-system-id", "serial": "--serial"}
    args = [arg for field, value in fields.items() for arg in (options[field], str(value))]
    # asked first under the lab's "destructive" policy
    # (tests/unit/store_rollout/test_step_rules.py); not here
    done = cli_in_process(lab_env, "replace", store_id, *args, "--inventory", str(inventory), "--yes",
                          "--json", settings={"STORE_ROLLOUT_APPROVAL_POLICY": "never"})
    assert done.exit_code == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "Completed", result
    assert f"write hypervisor.mac: {new_mac}" in " ".join(done.stderr.split())
    assert {k: result["replaced"][k] for k in ("old_mac", "new_mac", "power")} == {
        "old_mac": old_mac, "new_mac": new_mac, "power": "unreachable"}, result["replaced"]
    assert result["hypervisor_reinstalled"] and result["hypervisor_serial"] == box.serial
    assert power_actions(lab, f"{hv}-new") == {"on": 1, "off": 0}
    # one record, on the new MAC; a new key for the host; the store VM on the new box
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    assert cobbler.find_systems(name=f"store-{store_id}-*") == [hv]
    assert cobbler.find_systems(mac_address=old_mac) == []
    assert cobbler.find_systems(mac_address=new_mac) == [hv]
    assert master.fingerprints(hv)["minions"] not in ([], old_key)
    check_store(lab, store_id, result, vms=2)
    replaced = [n for n in created_erp_notices(lab, store_id)
                if n["payload"]["status"] == "store-hardware-replaced"]
    assert [(n["erp_id"], n["payload"]["hardware"]["mac"]) for n in replaced] == [
        (result["replaced"]["erp_id"], new_mac)], replaced
    entry["hypervisor"].update(fields)
    moved = inventory.with_name("moved.yaml")
    moved.write_text(yaml.safe_dump(raw))
    status = json.loads(cli_in_process(lab_env, "reconcile", store_id, "--inventory", str(moved),
                                       "--json").stdout)["stores"][store_id]
    assert (status["status"], status["mismatches"]) == ("ok", []), status


def store_traces(lab: LabInfo, store_id: str, mac: str) -> dict[str, Any]:
    """What Cobbler (its record, the DHCP server's configuration), Salt (keys in any state,
    autosign tokens) and libvirt (the VM's domain and disk dir) hold of a store, and its host's
    power."""
    import libvirt

    hv, vm = f"store-{store_id}-hv", f"store-{store_id}-vm"
    master = SaltMasterClient(lab.salt_master_config)
    keys = master.list_keys()
    conn = libvirt.openReadOnly(lab.libvirt_uri)
    try:
        domains = [d.name() for d in conn.listAllDomains()]
        host_on = bool(conn.lookupByName(hv).isActive())
    finally:
        conn.close()
    dnsmasq = (LabPaths(Path(lab.state_dir)).cobbler / "etc" / "u" / "dnsmasq.conf").read_text()
    return {
        "cobbler": CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                                 password=lab.cobbler_password).get_system(hv) is not None,
        "dhcp": [line for line in dnsmasq.splitlines() if mac in line],
        "keys": {bucket: [m for m in ids if m in (hv, vm)] for bucket, ids in keys.items()
                 if set(ids) & {hv, vm}},
        "tokens": [m for m in (hv, vm) if master.token_for(m)],
        "domain": vm in domains, "disk": (Path(lab.vm_images_dir) / vm).exists(),
        "host_on": host_on}


def check_decommission_leaves_nothing(lab: LabInfo, lab_env: dict[str, str], inventory: Path,
                                      store_id: str) -> None:
    """A rolled-out store closed: nothing of it left in Cobbler, Salt or libvirt, its host off,
    the ERP told, reconcile says decommissioned; a second decommission changes nothing."""
    mac = next(s["hypervisor"]["mac"] for s in yaml.safe_load(inventory.read_text())["stores"]
               if s["store_id"] == store_id)
    before = store_traces(lab, store_id, mac)
    assert before["cobbler"] and before["dhcp"] and before["domain"] and before["host_on"], before
    # issue 47: something the store server wrote on its data disk, found again in the export
    master = SaltMasterClient(lab.salt_master_config)
    vm = f"store-{store_id}-vm"
    note = master.cmd(vm, "provisioning.root_path", [f"{DATA_DISK_MOUNT[1:]}/till-journal.txt"])
    master.cmd(vm, "file.write", [note, f"the sales of store {store_id}"])
    data = Path(lab.vm_images_dir) / vm / DATA_DISK_FILE
    assert data.is_file()
    shown = cli_in_process(lab_env, "decommission", store_id, "--inventory", str(inventory),
                           "--no-export")
    assert shown.exit_code == 2 and "WITHOUT an export of its data disk" in " ".join(
        shown.stderr.split()), shown.stderr[-2000:]
    done = cli_in_process(lab_env, "decommission", store_id, "--inventory", str(inventory),
                          "--yes", *code_args(lab, "ben"))
    assert done.exit_code == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert (result["vm"]["domain"], result["vm"]["disk_dir"], result["vm"]["data_disk"]) == (
        True, True, {"path": str(data), "kept": False, "said": f"the store's data disk {data} "
                     f"on store-{store_id}-hv is removed"}), result
    assert not data.exists()
    check_data_export(lab, result["data_export"], store_id, data)
    assert result["keys"]["keys_deleted"] == [f"store-{store_id}-hv", f"store-{store_id}-vm"]
    assert (result["cobbler"]["removed"], result["power"]["was"]) == (True, "on"), result
    gone = {"cobbler": False, "dhcp": [], "keys": {}, "tokens": [], "domain": False,
            "disk": False, "host_on": False}
    assert store_traces(lab, store_id, mac) == gone
    notice = [n for n in created_erp_notices(lab, store_id)
              if n["payload"]["status"] == "store-decommissioned"]
    assert [n["erp_id"] for n in notice] == [result["erp_id"]], notice
    status = json.loads(cli_in_process(lab_env, "reconcile", store_id, "--inventory",
                                       str(inventory), "--json").stdout)["stores"][store_id]
    assert (status["status"], status["mismatches"]) == ("decommissioned", []), status
    again = cli_in_process(lab_env, "decommission", store_id, "--inventory", str(inventory),
                          "--yes", *code_args(lab, "ben"))
    assert again.exit_code == 0, again.stderr[-3000:]
    second = json.loads(again.stdout)
    assert second["vm"]["host_gone"] and second["keys"]["keys_deleted"] == [], second
    # its host is off: the export the first run kept stands
    assert {k: second["data_export"][k] for k in ("path", "sha256", "from_earlier_run")} == {
        "path": result["data_export"]["path"], "sha256": result["data_export"]["sha256"],
        "from_earlier_run": True}, second
    assert (second["cobbler"]["removed"], second["power"]["was"]) == (False, "off"), second
    assert (second["erp_id"], second["erp_replayed"]) == (result["erp_id"], True), second
    assert store_traces(lab, store_id, mac) == gone
    # issue 44: the store's audit trail names who approved each decommission (proven by a
    # one-time code), as an auditor exports it
    export = cli_in_process(lab_env, "audit", "export", "--store", store_id, "--json")
    assert export.exit_code == 0, export.stderr[-2000:]
    # (the last four: a lab kept from an earlier session has that store's earlier ones)
    trail = [(r["action"], r["person"], r["decision"]) for r in json.loads(export.stdout)][-4:]
    assert trail == [("decommission", "ben", "approved"), ("decommission", "ben", "done")] * 2, \
        trail


def check_data_export(lab: LabInfo, export: dict[str, Any], store_id: str, data: Path) -> None:
    """The decommission's export of the store's data disk: kept in the lab's data_export_dir
    (out of the master's cache), checked by `sha256sum -c`, and a restore of it holds what the
    store server wrote on its data disk."""
    import tempfile

    kept = Path(export["path"])
    assert export["kept"] is True and kept.parent == Path(lab.state_dir) / "data-exports" / store_id
    assert export["data_disk"] == str(data), export
    check = subprocess.run(["sha256sum", "-c", f"{kept.name}.sha256"], cwd=kept.parent,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and check.stdout.strip() == f"{kept.name}: OK", check
    cache = SaltMasterClient(lab.salt_master_config).opts["cachedir"]
    assert not list(Path(cache).glob(f"minions/*/files/**/{kept.name}"))
    with tempfile.TemporaryDirectory() as restored:
        subprocess.run(["tar", "-xSzf", str(kept), "-C", restored], check=True, timeout=120)
        journal = subprocess.run(["debugfs", "-R", "cat /till-journal.txt",
                                  str(Path(restored) / DATA_DISK_FILE)],
                                 capture_output=True, text=True, timeout=60, check=False)
    assert journal.stdout == f"the sales of store {store_id}\n", journal  # file.write adds one


def check_another_box_stops_at_step_3(lab: LabInfo, lab_env: dict[str, str], inventory: Path,
                                      store_id: str) -> None:
    """The inventory names another serial than the installed host's: step 3 fails naming both,
    step 4 never runs, and reconcile names the box."""
    raw = yaml.safe_load(inventory.read_text())
    entry = next(s for s in raw["stores"] if s["store_id"] == store_id)
    label, entry["hypervisor"]["serial"] = entry["hypervisor"]["serial"], "CZ-OTHER-BOX"
    other = inventory.with_name("other-box.yaml")
    other.write_text(yaml.safe_dump(raw))
    proc = start_rollout(lab_env, store_id, other)
    _, err = proc.communicate(timeout=300)
    said = " ".join(err.split())
    assert proc.returncode == 1, err[-3000:]
    assert (f"store {store_id}: hypervisor store-{store_id}-hv reports serial {label!r}, but the "
            "inventory's hypervisor.serial is 'CZ-OTHER-BOX': this is not the store's box") in said
    flow_run = api_session(lab).post(f"{lab.prefect_api_url}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{store_id}"]}}, "sort": "START_TIME_DESC",
        "limit": 1}, timeout=10).json()[0]
    assert flow_run["state_type"] == "FAILED"

    def steps_recorded() -> dict[str, str] | None:
        tasks = api_session(lab).post(f"{lab.prefect_api_url}/task_runs/filter", json={
            "task_runs": {"flow_run_id": {"any_": [flow_run["id"]]}}}, timeout=10).json()
        states = {t["name"].removesuffix(f"-{store_id}"): t["state_type"] for t in tasks}
        return states if states.get("wait_for_hypervisor") == "FAILED" else None

    states = wait_for(steps_recorded, timeout=30, interval=1,
                      what=f"the failed step 3 of rollout-{store_id} in Prefect")
    assert "prepare_vm_keys" not in states, states
    status = json.loads(cli_in_process(lab_env, "reconcile", store_id, "--inventory", str(other),
                                       "--json").stdout)["stores"][store_id]
    assert "wrong-hardware" in [m["code"] for m in status["mismatches"]], status


def check_store_comes_back_after_a_power_cut(lab: LabInfo, lab_env: dict[str, str],
                                             inventory: Path, store_id: str) -> None:
    """The hypervisor loses power (its OS, minion and domains stop at once), then boots from
    disk: its libvirt starts the store VM marked autostart, the VM's minion comes back, and
    reconcile finds the store ok, with no rollout run in between."""
    import libvirt

    hv, vm = f"store-{store_id}-hv", f"store-{store_id}-vm"
    master = SaltMasterClient(lab.salt_master_config)

    def vm_active() -> bool:
        conn = libvirt.open(lab.libvirt_uri)
        try:
            return bool(conn.lookupByName(vm).isActive())
        finally:
            conn.close()

    bmc_power(lab, hv, "off")
    wait_for(lambda: not vm_active(), timeout=30, what=f"{vm} down with its host")
    # neither answers (one job for both: a silent minion costs the whole timeout; its entry
    # is absent or a failure, as `ping` counts it)
    answers = master.cmd_many([hv, vm], "test.ping", timeout=3)
    assert not [m for m, ret in answers.items() if ret is True], answers
    bmc_power(lab, hv, "on")
    wait_for(vm_active, timeout=60, what=f"{vm} started by its host's autostart")
    wait_for(lambda: master.ping(vm, timeout=3) and master.ping(hv, timeout=3), timeout=90,
             what=f"the minions of {hv} and {vm} back after the power cut")
    done = cli_in_process(lab_env, "reconcile", store_id, "--inventory", str(inventory), "--json")
    assert done.exit_code == 0, (done.exception, done.stdout[-3000:] + done.stderr[-3000:])
    assert json.loads(done.stdout)["stores"][store_id]["status"] == "ok", done.stdout


def check_image_server_answers_ranges_on_the_store_network(lab: LabInfo, key: str) -> None:
    """What a resumed download asks for, asked where store hosts ask it: image_base_url is the
    gateway's address, which the orchestrator itself has no route to."""
    network = StoreNetwork.load(Path(lab.store_network_state))
    url = f"{lab.image_base_url}/{key}/image.qcow2"
    assert url.startswith(f"http://{GATEWAY}:")
    ranged = network.run([sys.executable, "-c", RANGE_GET, url], capture_output=True, text=True,
                         timeout=30)
    assert ranged.returncode == 0, ranged.stderr
    assert json.loads(ranged.stdout) == {"status": 206, "length": 10}
    # not from the orchestrator's namespace: no route, or (a machine whose own network answers
    # any address, as an intercepting proxy does) an answer that is not the image's range
    try:
        answer = requests.get(url, headers={"Range": "bytes=0-9"}, timeout=3)
    except requests.RequestException:
        return
    assert answer.status_code != 206, "the orchestrator reached the store network's gateway"


RANGE_GET = """
import json, sys, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Range": "bytes=0-9"})
with urllib.request.urlopen(request, timeout=10) as r:
    print(json.dumps({"status": r.status, "length": len(r.read())}))
"""


def check_machines_on_the_store_network(lab: LabInfo, store_id: str) -> None:
    """The hypervisor and the VM each run in a network namespace of their own, with a lab
    address on the store network, and reach the master only at the gateway: the
    orchestrator's loopback (where the master listens) is not theirs."""
    master = SaltMasterClient(lab.salt_master_config)
    seen = set()
    for minion in (f"store-{store_id}-hv", f"store-{store_id}-vm"):
        namespace = master.cmd(minion, "cmd.run", ["readlink /proc/self/ns/net"])
        assert namespace.startswith("net:[") and namespace != os.readlink("/proc/self/ns/net")
        seen.add(namespace)
        addresses = [a for a in master.cmd(minion, "network.ip_addrs") if a != "127.0.0.1"]
        assert addresses and all(ipaddress.ip_address(a) in NETWORK for a in addresses), addresses
        assert connect(master, minion, GATEWAY, lab.salt_ret_port) == ""
        refused = connect(master, minion, "127.0.0.1", lab.salt_ret_port)
        assert "Unable to connect to 127.0.0.1" in refused, refused
        # no route out of the store network
        assert "Unable to connect to 192.0.2.1" in connect(master, minion, "192.0.2.1", 80)
    assert len(seen) == 2  # one namespace per machine


def connect(master: SaltMasterClient, minion: str, host: str, port: int) -> str:
    """A TCP connect from the minion's machine: "" when it connects, else Salt's reason."""
    try:
        master.cmd(minion, "network.connect", [host, port], {"timeout": 3})
    except SaltCommandFailed as exc:
        return exc.detail  # the summary of {'result': False, 'comment': ...}
    return ""


def check_hypervisor_sees_no_orchestrator_state(lab: LabInfo, store_id: str, key: str) -> None:
    """A simulated store host runs in a mount namespace of its own: the orchestrator's image
    cache, master config and lab.json are not there, so a file:// path of this machine fails."""
    master = SaltMasterClient(lab.salt_master_config)
    hv = f"store-{store_id}-hv"
    assert master.cmd(hv, "cmd.run", ["readlink /proc/self/ns/mnt"]) != os.readlink(
        "/proc/self/ns/mnt")
    cached = Path(lab.image_cache_dir) / key / "image.qcow2"
    for path in (cached, Path(lab.state_dir) / "lab.json", Path(lab.salt_master_config)):
        assert path.exists() and master.cmd(hv, "file.file_exists", [str(path)]) is False, path
    # what step 5 once did (`cp` of a file:// path of the orchestrator) fails there
    try:
        copied = master.cmd(hv, "cmd.run_all", [f"cp --sparse=always {cached} /dev/null"])
        detail = f"retcode {copied['retcode']}: {copied['stderr']}"
    except SaltCommandFailed as exc:
        detail = exc.detail
    assert "No such file or directory" in detail, detail
    # what a store host does have: its VM disks (shared with libvirtd) and the base image
    assert master.cmd(hv, "file.file_exists", [
        str(Path(lab.vm_images_dir) / "base" / key / "image.qcow2")]) is True


def check_transfer_at_the_links_rate(lab: LabInfo, first: dict[str, Any]) -> None:
    """Issue 49: over LTE (10 Mbit/s down), the base image's transfer took its size / the link's
    rate, within 15 %, and the run's artifact says the rate."""
    delivery = first["vm"]["image_delivery"]
    assert delivery["cached"] is False and delivery["transferred"] > 8 << 20, delivery
    expected = delivery["transferred"] * 8 / 10e6
    assert abs(delivery["seconds"] - expected) <= 0.15 * expected, (delivery, expected)
    api = lab.prefect_api_url
    artifacts = api_session(api).post(f"{api}/artifacts/filter", json={
        "artifacts": {"key": {"any_": ["rollout-e2e1"]}}, "sort": "CREATED_DESC", "limit": 1},
        timeout=10).json()
    rate = delivery["transferred"] * 8 / delivery["seconds"] / 1e6
    assert f"= **{rate:.2f} Mbit/s**" in artifacts[0]["data"], artifacts[0]["data"]


def check_staging(lab_env: dict[str, str], inventory: Path, first: dict[str, Any]) -> None:
    """`store-rollout stage`: a hypervisor that has the image gets nothing more; one that is not
    installed yet is refused with what to do."""
    if not first["vm"]["reused"]:  # a fresh domain: step 5 made sure of the base image
        delivery = first["vm"]["image_delivery"]
        assert delivery["path"].endswith(f"/base/{first['image_key']}/image.qcow2")

    def stage(*store_ids: str) -> Any:
        return cli_in_process(lab_env, "stage", *store_ids, "--inventory", str(inventory),
                              "--json", settings={"STORE_ROLLOUT_IMAGE_PARAMS":
                                                  lab_env["STORE_ROLLOUT_IMAGE_PARAMS"]})

    staged = stage("e2e1")
    assert staged.exit_code == 0, (staged.exception, staged.stderr[-2000:])
    result = json.loads(staged.stdout)
    assert result["image_key"] == first["image_key"]
    assert result["stores"]["e2e1"]["cached"] is True
    assert result["stores"]["e2e1"]["transferred"] == 0
    refused = stage("e2e4")  # never rolled out: no hypervisor to stage on
    assert refused.exit_code == 1, (refused.exception, refused.stderr[-2000:])
    message = " ".join(refused.stderr.split())
    assert "hypervisor store-e2e4-hv does not answer" in message
    assert "store-rollout rollout e2e4" in message


def check_defined_as_vm_xml_says(lab: LabInfo, inventory: Path, store_id: str) -> None:
    """The domain step 5 defined has the devices `store-rollout vm-xml` prints (one code path):
    same disks (device, target, bus, source; the seed CD-ROM now ejected), NICs, consoles."""
    import libvirt

    from store_rollout.inventory import load_inventory
    from tasks.vm_domain import domain_xml

    store = load_inventory(inventory).get(store_id)
    planned = ET.fromstring(domain_xml(store, "qemu", lab.vm_images_dir))
    conn = libvirt.open(lab.libvirt_uri)
    try:
        defined = ET.fromstring(conn.lookupByName(store.vm_name).XMLDesc(
            libvirt.VIR_DOMAIN_XML_INACTIVE))
    finally:
        conn.close()

    def devices(root: ET.Element) -> dict[str, Any]:
        return {
            "disks": [(d.get("device"), d.find("target").attrib,  # type: ignore[union-attr]
                       (d.find("source").get("file") if d.find("source") is not None  # type: ignore[union-attr]
                        and d.get("device") == "disk" else None))
                      for d in root.iterfind("./devices/disk")],
            "nics": [(n.get("type"), n.find("model").get("type"))  # type: ignore[union-attr]
                     for n in root.iterfind("./devices/interface")],
            "serials": [s.get("type") for s in root.iterfind("./devices/serial")],
            "vnc": root.find("./devices/graphics").get("listen"),  # type: ignore[union-attr]
        }

    assert devices(defined) == devices(planned)
    # the system disk, the data disk (issue 47), the seed CD-ROM
    assert [d.get("device") for d in planned.iterfind("./devices/disk")] == ["disk", "disk",
                                                                             "cdrom"]


def check_salt_events_in_prefect(lab: LabInfo, store_id: str) -> None:
    """The Salt engine forwarded the store's rollout events into Prefect's event feed."""
    wanted = {"salt.store.hypervisor.ready", "salt.store.vm.firstboot.done"}

    def forwarded() -> set[str] | None:
        events = api_session(lab).post(f"{lab.prefect_api_url}/events/filter", json={
            "filter": {"event": {"prefix": ["salt.store."]},
                       "resource": {"labels": {"store.id": [store_id]}}},
            "limit": 50}, timeout=10).json()
        seen = {e["event"] for e in events["events"]}
        return seen if wanted <= seen else None

    wait_for(forwarded, timeout=30, interval=1, what=f"{sorted(wanted)} in Prefect's event feed")
    # the same events are found through the store as a related resource (the UI's event feed)
    related = api_session(lab).post(f"{lab.prefect_api_url}/events/filter", json={
        "filter": {"event": {"prefix": ["salt.store."]},
                   "related": {"id": [f"store.{store_id}"], "role": ["store"]}},
        "limit": 50}, timeout=10).json()
    assert wanted <= {e["event"] for e in related["events"]}, related


def system_snapshot(lab: LabInfo) -> dict[str, Any]:
    import libvirt

    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    conn = libvirt.open(lab.libvirt_uri)
    try:
        domains = sorted(d.name() for d in conn.listAllDomains())
    finally:
        conn.close()
    return {"systems": sorted(cobbler.find_systems(name="*")),
            "keys": SaltMasterClient(lab.salt_master_config).list_keys(),
            "domains": domains,
            "erp": Path(lab.erp_log).read_text() if os.path.exists(lab.erp_log) else ""}


@pytest.mark.parametrize("case", ["missing-store", "invalid-mac"])
def test_bad_input_exits_nonzero_and_changes_nothing(case: str, lab: LabInfo,
                                                      lab_env: dict[str, str],
                                                      tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", ["bad1"], lab=lab)
    store_id = "nope"
    if case == "invalid-mac":
        raw = yaml.safe_load(inventory.read_text())
        raw["stores"][0]["hypervisor"]["mac"] = "52:54:00:zz:00:01"
        inventory.write_text(yaml.safe_dump(raw))
        store_id = "bad1"
    before = system_snapshot(lab)
    proc = subprocess.run([str(VENV_BIN / "store-rollout"), "rollout", store_id,
                           "--inventory", str(inventory)], env=lab_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())
    if case == "missing-store":
        assert "store_id 'nope' is not in the inventory" in message
    else:
        assert "hypervisor.mac" in message and "invalid MAC" in message
    assert system_snapshot(lab) == before
