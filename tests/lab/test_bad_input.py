"""Issue 5: bad input is refused before any side effect, with a message naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from app.cli import app
from lab.state import LabInfo, LabPaths
from tests.lab.test_rollout_e2e import system_snapshot

pytestmark = pytest.mark.lab

BASE: dict[str, Any] = {"stores": [{
    "store_id": "bi1",
    "hypervisor": {"hostname": "hv-bi1.bad.invalid", "mac": "52:54:00:b1:00:01",
                   "ip": "192.0.2.11", "netmask": "255.255.255.0", "gateway": "192.0.2.1",
                   # preflight does not call a BMC: no host needs to answer here
                   "power_type": "ipmi", "power_address": "192.0.2.211"},
    "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
    "erp": {"site_code": "BI-1"}}]}
SECOND = {"store_id": "bi2", "hypervisor": {"hostname": "hv-bi2.bad.invalid",
                                            "mac": "52:54:00:b1:00:02", "ip": "192.0.2.12",
                                            "netmask": "255.255.255.0"},
          "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
          "erp": {"site_code": "BI-2"}}


def field(path: str, value: Any) -> Any:
    def mutate(inv: dict[str, Any]) -> None:
        target = inv["stores"][0]
        *parents, last = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        if value is DELETE:
            target.pop(last)
        else:
            target[last] = value
    return mutate


def duplicate(path: str) -> Any:
    def mutate(inv: dict[str, Any]) -> None:
        other = copy.deepcopy(SECOND)
        src, dst = inv["stores"][0], other
        *parents, last = path.split(".")
        for part in parents:
            src, dst = src[part], dst.setdefault(part, {})
        dst[last] = src[last]
        inv["stores"].append(other)
    return mutate


DELETE = object()
# (case id, store id, inventory mutation, env overrides, raw file text, expected message part)
CASES: list[tuple[str, str, Any, dict[str, str], str | None, str]] = [
    ("store-missing", "nope", None, {}, None, "store_id 'nope' is not in the inventory"),
    ("store-id-upper", "BI1", field("store_id", "BI1"), {}, None, "invalid store_id 'BI1'"),
    ("store-id-long", "x" * 30, field("store_id", "x" * 30), {}, None, "invalid store_id"),
    ("store-id-empty", "bi1", field("store_id", ""), {}, None, "store_id"),
    ("mac-bad-hex", "bi1", field("hypervisor.mac", "52:54:00:zz:00:01"), {}, None,
     "hypervisor.mac: invalid MAC"),
    ("mac-short", "bi1", field("hypervisor.mac", "52:54:00:00:01"), {}, None,
     "hypervisor.mac: invalid MAC"),
    ("mac-multicast", "bi1", field("hypervisor.mac", "01:00:5e:00:00:01"), {}, None,
     "hypervisor.mac: MAC '01:00:5e:00:00:01' is a multicast address"),
    ("mac-all-zero", "bi1", field("hypervisor.mac", "00:00:00:00:00:00"), {}, None,
     "store 'bi1': hypervisor.mac: MAC '00:00:00:00:00:00' is all zeros"),
    ("mac-broadcast", "bi1", field("hypervisor.mac", "ff:ff:ff:ff:ff:ff"), {}, None,
     "store 'bi1': hypervisor.mac: MAC 'ff:ff:ff:ff:ff:ff' is the broadcast address"),
    ("ip-bad", "bi1", field("hypervisor.ip", "999.1.1.1"), {}, None,
     "hypervisor.ip: invalid IPv4 address"),
    ("ip-loopback", "bi1", field("hypervisor.ip", "127.0.0.1"), {}, None,
     "hypervisor.ip: IP '127.0.0.1' cannot be a host address"),
    ("netmask-bad", "bi1", field("hypervisor.netmask", "255.255.255.300"), {}, None,
     "hypervisor.netmask: invalid IPv4"),
    ("gateway-bad", "bi1", field("hypervisor.gateway", "router"), {}, None,
     "hypervisor.gateway: invalid IPv4"),
    ("gateway-outside-network", "bi1", field("hypervisor.gateway", "198.51.100.1"), {}, None,
     "hypervisor: gateway 198.51.100.1 is outside the host's network"),
    ("dhcp-with-netmask", "bi1", field("hypervisor.ip", "dhcp"), {}, None,
     "given for a DHCP host (ip: dhcp)"),
    ("hostname-bad", "bi1", field("hypervisor.hostname", "bad_host!"), {}, None,
     "hypervisor.hostname: invalid hostname"),
    ("dup-store", "bi1", duplicate("store_id"), {}, None, "duplicate store_id 'bi1'"),
    ("dup-mac", "bi1", duplicate("hypervisor.mac"), {}, None, "duplicate hypervisor.mac"),
    ("dup-hostname", "bi1", duplicate("hypervisor.hostname"), {}, None,
     "duplicate hypervisor.hostname"),
    ("dup-ip", "bi1", duplicate("hypervisor.ip"), {}, None, "duplicate hypervisor.ip"),
    ("dup-vm-name", "bi1", lambda inv: (field("vm.name", "shared-vm")(inv),
                                        inv["stores"].append({**copy.deepcopy(SECOND), "vm": {
                                            "name": "shared-vm", "disk_gib": 2}})),
     {}, None, "duplicate vm.name 'shared-vm'"),
    ("cobbler-profile-unknown", "bi1", field("hypervisor.cobbler_profile", "no-such-profile"),
     {}, None, "hypervisor.cobbler_profile: Cobbler has no profile 'no-such-profile'"),
    ("vcpus-zero", "bi1", field("vm.vcpus", 0), {}, None, "vm.vcpus"),
    ("vcpus-too-many", "bi1", field("vm.vcpus", 65), {}, None, "vm.vcpus"),
    ("memory-small", "bi1", field("vm.memory_mib", 64), {}, None, "vm.memory_mib"),
    ("memory-huge", "bi1", field("vm.memory_mib", 300000), {}, None, "vm.memory_mib"),
    ("disk-zero", "bi1", field("vm.disk_gib", 0), {}, None, "vm.disk_gib"),
    ("disk-smaller-than-image", "bi1", field("vm.disk_gib", 1), {}, None,
     "vm.disk_gib: 1 GiB is smaller than the image"),
    ("vm-name-bad", "bi1", field("vm.name", "Bad Name"), {}, None, "vm.name: invalid VM name"),
    ("network-bad", "bi1", field("vm.network", "br 0"), {}, None, "vm.network: invalid network"),
    ("unknown-field", "bi1", field("hypervisor.macc", "x"), {}, None,
     "hypervisor.macc: unknown field"),
    ("erp-missing", "bi1", field("erp", DELETE), {}, None, "erp: missing"),
    ("site-code-bad", "bi1", field("erp.site_code", "no spaces"), {}, None,
     "erp.site_code: invalid ERP site code"),
    ("yaml-broken", "bi1", None, {}, "stores: [\n  - store_id: [", "not valid YAML"),
    ("no-stores-list", "bi1", None, {}, "shops: []\n", "expected a mapping with a 'stores:' list"),
    ("image-description-missing", "bi1", None, {"STORE_ROLLOUT_IMAGE_DESCRIPTION": "nope"}, None,
     "image_description: no image description 'nope'"),
    ("cobbler-unreachable", "bi1", None, {"STORE_ROLLOUT_COBBLER_URL": "http://127.0.0.1:9/"},
     None, "cobbler_url: Cobbler at http://127.0.0.1:9/ unreachable"),
    ("erp-unreachable", "bi1", None, {"STORE_ROLLOUT_ERP_URL": "http://127.0.0.1:9"}, None,
     "erp_url: the ERP at http://127.0.0.1:9 unreachable"),
    ("salt-config-missing", "bi1", None,
     {"STORE_ROLLOUT_SALT_MASTER_CONFIG": "/nonexistent/master"}, None,
     "salt_master_config: /nonexistent/master is not a file"),
    ("cobbler-user-wrong", "bi1", None, {"STORE_ROLLOUT_COBBLER_USER": "nobody"},
     None, "login failed"),
    # secrets come from Blocks only (the default credentials: tests/lab/test_security.py)
    ("cobbler-password-in-env", "bi1", None, {"STORE_ROLLOUT_COBBLER_PASSWORD": "wrong-password"},
     None, "STORE_ROLLOUT_COBBLER_PASSWORD (in the environment): secrets are not read"),
    ("erp-token-block-unknown", "bi1", None, {"STORE_ROLLOUT_ERP_TOKEN_BLOCK": "no-such-token"},
     None, "no Secret block named 'no-such-token'"),
    ("cobbler-http-off-loopback", "bi1", None, {"STORE_ROLLOUT_COBBLER_URL": "http://10.9.9.9/"},
     None, "use https://, or set STORE_ROLLOUT_INSECURE_COBBLER_HTTP=true"),
    ("erp-timeout-bad", "bi1", None, {"STORE_ROLLOUT_ERP_TIMEOUT_SECONDS": "-1"}, None,
     "erp_timeout_seconds"),
    ("bmc-address-missing", "bi1", field("hypervisor.power_address", DELETE), {}, None,
     "store 'bi1': hypervisor.power_address: no BMC address"),
    ("bmc-block-unknown", "bi1", None, {"STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": "no-such-bmc"},
     None, "store 'bi1': no BMC Credentials Block named 'no-such-bmc'"),
    ("bmc-block-unnamed", "bi1", None, {"STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": ""}, None,
     "store 'bi1': no BMC Credentials Block named: set STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK"),
    ("bmc-password-in-inventory", "bi1", field("hypervisor.power_password", "x"), {}, None,
     "hypervisor: power_password: BMC logins are not read from the inventory"),
    ("bmc-password-in-settings", "bi1", None, {"STORE_ROLLOUT_POWER_PASSWORD": "x"}, None,
     "STORE_ROLLOUT_POWER_PASSWORD: no longer read"),
    ("power-type-unknown", "bi1", field("hypervisor.power_type", "lanplus"), {}, None,
     "hypervisor.power_type: Input should be 'ipmi' or 'redfish'"),
    ("power-port-bad", "bi1", field("hypervisor.power_port", 70000), {}, None,
     "hypervisor.power_port"),
    # issue 46: a store's platform, and what cannot work on it
    ("platform-unknown", "bi1", field("hypervisor.platform", "leap15-xen"), {}, None,
     "hypervisor.platform: Input should be 'sles15-xen' or 'sle16-kvm'"),
    ("platform-missing", "bi1", None, {"STORE_ROLLOUT_HYPERVISOR_PLATFORM": ""}, None,
     "store bi1: hypervisor.platform missing"),
    ("kvm-store-xen-vm-type", "bi1", field("hypervisor.platform", "sle16-kvm"),
     {"STORE_ROLLOUT_VM_TYPE": "xen"}, None,
     "store bi1 (sle16-kvm): vm_type xen: a sle16-kvm host runs kvm VMs"),
    ("xen-option-on-kvm", "bi1", lambda inv: inv["stores"][0]["hypervisor"].update(
        platform="sle16-kvm", dom0_mem="4096M"), {}, None,
     "hypervisor.dom0_mem 4096M: a Xen hypervisor option"),
    ("registration-url-missing", "bi1", None, {"STORE_ROLLOUT_REGISTRATION_URL": ""}, None,
     "registration_url missing: a sles15-xen host installs SLES"),
    ("registration-code-in-env", "bi1", None, {"STORE_ROLLOUT_REGISTRATION_CODE": "X"}, None,
     "STORE_ROLLOUT_REGISTRATION_CODE (in the environment): secrets are not read"),
]


def test_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


def test_bad_input_refused_and_nothing_changes(lab: LabInfo, lab_dir: Path,
                                               tmp_path: Path) -> None:
    runner = CliRunner()
    before = system_snapshot(lab)
    failures = []
    for case_id, store_id, mutate, env, raw, expected in CASES:
        inv_path = tmp_path / f"{case_id}.yaml"
        if raw is not None:
            inv_path.write_text(raw)
        else:
            inv = copy.deepcopy(BASE)
            if mutate is not None:
                mutate(inv)
            inv_path.write_text(yaml.safe_dump(inv))
        result = runner.invoke(app, ["rollout", store_id, "--inventory", str(inv_path)],
                               env={"STORE_ROLLOUT_SETTINGS_FILE": str(LabPaths(lab_dir).settings_file),
                                    **env})
        output = " ".join(result.output.split())
        if result.exit_code == 0 or expected not in output:
            failures.append(f"{case_id}: exit {result.exit_code}, output: {output[:300]}")
    assert failures == []
    assert system_snapshot(lab) == before


def test_csv_inventory_errors_name_the_column(tmp_path: Path) -> None:
    from store_rollout.inventory import InventoryError, load_inventory

    good = tmp_path / "good.csv"
    good.write_text("store_id,hv_hostname,hv_mac,erp_site_code,vm_disk_gib\n"
                    "c1,hv-c1.x.invalid,52:54:00:c0:00:01,C-1,4\n")
    assert load_inventory(good).get("c1").vm.disk_gib == 4
    bad_col = tmp_path / "col.csv"
    bad_col.write_text("store_id,hv_mack\nc1,x\n")
    with pytest.raises(InventoryError, match="unknown CSV column"):
        load_inventory(bad_col)
    bad_mac = tmp_path / "mac.csv"
    bad_mac.write_text("store_id,hv_hostname,hv_mac,erp_site_code\nc1,hv.x.invalid,nope,C-1\n")
    with pytest.raises(InventoryError, match=r"store 'c1': hypervisor.mac: invalid MAC"):
        load_inventory(bad_mac)
