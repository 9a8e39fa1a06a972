"""A store's platform (store_rollout/platforms.py): where it comes from, and the combinations
that cannot work refused before anything is touched, naming the field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from store_rollout.fleet.facts import StoreFacts
from store_rollout.fleet.reconcile import reconcile_store
from store_rollout.inventory import InventoryError, load_inventory, parse_inventory
from store_rollout.inventory.models import Inventory
from store_rollout.platforms import PLATFORMS, PlatformError, host_platform, retired_since
from store_rollout.settings import SettingsError, load_settings
from store_rollout.settings_parts import HostSettings
from tasks.cobbler import system_spec
from tasks.preflight import store_profiles
from tests.helpers import BASE_ENV, spec_parts


def inventory(*platforms: str | None, defaults: str | None = None, **hv: Any) -> Inventory:
    stores = [{"store_id": f"00{n}", "erp": {"site_code": f"S{n}"},
               "hypervisor": {"hostname": f"hv-{n}.invalid", "mac": f"52:54:00:00:00:0{n}",
                              **({"platform": p} if p else {}), **hv}}
              for n, p in enumerate(platforms, 1)]
    return parse_inventory({"stores": stores,
                            **({"defaults": {"platform": defaults}} if defaults else {})})


def hosts(**env: str) -> HostSettings:
    return HostSettings.of(load_settings({**BASE_ENV, **env}))


def test_a_stores_own_platform_wins_then_the_inventorys_default_then_the_chains() -> None:
    inv = inventory("sle16-kvm", None, defaults="sles15-xen")
    assert [s.hypervisor.platform for s in inv.stores] == ["sle16-kvm", "sles15-xen"]
    chain = hosts(STORE_ROLLOUT_HYPERVISOR_PLATFORM="sle16-kvm",
                  STORE_ROLLOUT_SLE16_PRODUCT="leap")
    assert host_platform(inventory(None).stores[0], chain).name == "sle16-kvm"
    assert host_platform(inventory("sles15-xen").stores[0], chain).name == "sles15-xen"


def test_a_store_without_a_platform_anywhere_is_refused_naming_where_to_set_it() -> None:
    none = hosts(STORE_ROLLOUT_HYPERVISOR_PLATFORM="")
    with pytest.raises(PlatformError) as refused:
        host_platform(inventory(None).stores[0], none)
    message = str(refused.value)
    assert message.startswith("store 001: hypervisor.platform missing")
    assert "defaults.platform" in message and "STORE_ROLLOUT_HYPERVISOR_PLATFORM" in message


def test_an_unknown_platform_is_refused_in_the_inventory_and_in_the_settings(tmp_path: Any) -> None:
    bad = tmp_path / "inv.csv"
    bad.write_text("store_id,hv_hostname,hv_mac,erp_site_code,hv_platform\n"
                   "0001,hv-1.invalid,52:54:00:00:00:01,S1,leap15-xen\n")
    with pytest.raises(InventoryError, match=r"hypervisor\.platform.*sles15-xen.*sle16-kvm"):
        load_inventory(bad)
    with pytest.raises(SettingsError, match="hypervisor_platform"):
        hosts(STORE_ROLLOUT_HYPERVISOR_PLATFORM="leap15-xen")


def test_the_csv_column_sets_the_platform(tmp_path: Any) -> None:
    path = tmp_path / "inv.csv"
    path.write_text("store_id;hv_hostname;hv_mac;erp_site_code;hv_platform\n"
                    "0001;hv-1.invalid;52:54:00:00:00:01;S1;sle16-kvm\n")
    assert load_inventory(path).stores[0].hypervisor.platform == "sle16-kvm"


def test_a_kvm_store_with_a_xen_vm_type_is_refused_before_anything_naming_the_field() -> None:
    store = inventory("sle16-kvm").stores[0]
    xen = hosts(STORE_ROLLOUT_VM_TYPE="xen")
    problems: list[str] = []
    assert store_profiles([store], xen, problems) == {}
    (problem,) = problems
    assert problem.startswith("store 001 (sle16-kvm): vm_type xen:")
    assert "STORE_ROLLOUT_VM_TYPE=kvm" in problem
    with pytest.raises(PlatformError, match="vm_type xen"):
        system_spec(store, *spec_parts(load_settings({**BASE_ENV, "STORE_ROLLOUT_VM_TYPE": "xen"})),
                    "tok")
    # a QEMU libvirt the settings name, with kvm domains, stands in for either (the full lab)
    stand_in = hosts(STORE_ROLLOUT_VM_TYPE="kvm",
                     STORE_ROLLOUT_HYPERVISOR_LIBVIRT_URI="qemu+unix:///system?socket=/x")
    assert host_platform(inventory("sles15-xen").stores[0], stand_in).name == "sles15-xen"
    with pytest.raises(PlatformError, match="vm_type kvm"):
        host_platform(inventory("sles15-xen").stores[0], hosts(STORE_ROLLOUT_VM_TYPE="kvm"))
    # emulation runs on either platform (the lab), and each platform takes its own type
    for vm_type, platform in (("qemu", "sle16-kvm"), ("qemu", "sles15-xen"), ("kvm", "sle16-kvm"),
                              ("xen", "sles15-xen")):
        assert host_platform(inventory(platform).stores[0],
                             hosts(STORE_ROLLOUT_VM_TYPE=vm_type)).name == platform


@pytest.mark.parametrize(("platform", "env", "hv", "field"), [
    ("sle16-kvm", {"STORE_ROLLOUT_HYPERVISOR_LIBVIRT_URI": "xen:///system"}, {},
     "hypervisor_libvirt_uri xen:///system"),
    ("sles15-xen", {"STORE_ROLLOUT_HYPERVISOR_LIBVIRT_URI": "qemu:///system"}, {},
     "hypervisor_libvirt_uri qemu:///system"),
    ("sle16-kvm", {}, {"dom0_mem": "4096M,max:4096M"}, "hypervisor.dom0_mem 4096M,max:4096M"),
    ("sles15-xen", {"STORE_ROLLOUT_REGISTRATION_URL": ""}, {}, "registration_url missing"),
    ("sle16-kvm", {"STORE_ROLLOUT_REGISTRATION_URL": "https://scc.suse.com"}, {},
     "registration_code_block missing"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_field(
        platform: str, env: dict[str, str], hv: dict[str, str], field: str) -> None:
    problems: list[str] = []
    store_profiles(inventory(platform, **hv).stores, hosts(**env), problems)
    assert len(problems) == 1 and f"({platform}): {field}" in problems[0], problems


def test_a_leap_16_host_registers_nowhere_and_a_rmt_needs_no_code() -> None:
    leap = hosts(STORE_ROLLOUT_SLE16_PRODUCT="leap", STORE_ROLLOUT_REGISTRATION_URL="")
    assert host_platform(inventory("sle16-kvm").stores[0], leap).name == "sle16-kvm"
    assert not PLATFORMS["sle16-kvm"].needs_registration("leap")
    assert PLATFORMS["sle16-kvm"].needs_registration("sles")


def test_each_platform_gets_its_own_profile_and_libvirt_uri_in_the_record() -> None:
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK": "regcode"})
    for platform, uri in (("sles15-xen", "xen:///system"), ("sle16-kvm", "qemu:///system")):
        spec = system_spec(inventory(platform).stores[0], *spec_parts(settings), "tok",
                           registration_code="CODE-1")
        assert spec.profile == f"store-hypervisor-{platform}"
        assert spec.autoinstall_meta["virt_uri"] == uri
        assert spec.autoinstall_meta["store_platform"] == platform
        assert spec.autoinstall_meta["registration_code"] == "CODE-1"
        assert "CODE-1" not in repr(spec)
    own = inventory("sle16-kvm", cobbler_profile="kvm-hosts").stores[0]
    assert system_spec(own, *spec_parts(settings), "tok").profile == "kvm-hosts"


def test_a_registration_code_in_the_settings_is_refused_without_its_value() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({**BASE_ENV, "STORE_ROLLOUT_REGISTRATION_CODE": "SECRET-REGCODE"})
    assert "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK" in str(refused.value)
    assert "SECRET-REGCODE" not in str(refused.value)


def _facts(**changes: Any) -> StoreFacts:
    return StoreFacts(store_id="0042", platform="sles15-xen", hypervisor="store-0042-hv",
                      vm="store-0042-vm", domain_name="store-0042-vm",
                      cobbler_system="store-0042-hv", image_key="ab" * 32, image_cached=True,
                      image_builder="lab", cobbler_record=True, cobbler_netboot=False,
                      hypervisor_key="accepted", hypervisor_answering=True,
                      hypervisor_ready=True, **changes)


def test_reconcile_flags_a_host_still_on_leap_15_6_with_the_fix() -> None:
    status = reconcile_store(_facts(host_os="Leap 15.6"), 90.0)
    (flag,) = [m for m in status.mismatches if m.code == "platform-out-of-support"]
    assert "runs Leap 15.6, out of support since 2026-04-30" in flag.what
    assert "reinstall it on sles15-xen in a maintenance window, approved" in flag.fix
    assert "--reinstall-hypervisor" in flag.fix
    assert status.platform == "sles15-xen" and "(Leap 15.6)" in status.real
    supported = reconcile_store(_facts(host_os="SLES 15.7"), 90.0)
    assert "platform-out-of-support" not in [m.code for m in supported.mismatches]
    assert retired_since("SLES 15.7") is None and retired_since(None) is None


def test_step_5_defines_the_platforms_vm_type_unless_the_settings_name_one() -> None:
    from store_rollout.platforms import store_vm_type

    unset = hosts()
    assert store_vm_type(inventory("sles15-xen").stores[0], unset) == "xen"
    assert store_vm_type(inventory("sle16-kvm").stores[0], unset) == "kvm"
    assert store_vm_type(inventory("sle16-kvm").stores[0],
                         hosts(STORE_ROLLOUT_VM_TYPE="qemu")) == "qemu"


def test_a_region_names_its_own_platform_over_the_chains(tmp_path: Any) -> None:
    import yaml

    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump({"regions": {
        "default": {"work_pool": "rollout-pool"},
        "east": {"work_pool": "rollout-east", "settings": {
            "hypervisor_platform": "sle16-kvm", "registration_url": "https://rmt-east.invalid"}}}}))
    chain = {**BASE_ENV, "STORE_ROLLOUT_REGIONS_FILE": str(path)}
    store = inventory(None).stores[0]
    assert host_platform(store, hosts(**chain)).name == "sles15-xen"
    east = hosts(**chain, STORE_ROLLOUT_REGION="east")
    assert host_platform(store, east).name == "sle16-kvm"
    assert east.registration_url == "https://rmt-east.invalid"
    # the store's own platform wins over its region's
    assert host_platform(inventory("sles15-xen").stores[0], east).name == "sles15-xen"
