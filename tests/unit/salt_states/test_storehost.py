"""The hypervisor formula's own Salt code (salt_states/_modules|_states/storehost.py): the Xen
boot entry, dom0 detection and the default-boot state, with fakes for what Salt injects."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from salt.exceptions import CommandExecutionError

from tests.helpers import load_salt_module

GRUB_CFG = """\
set default="${saved_entry}"
menuentry 'openSUSE Leap 15.6'  --class opensuse --class os $menuentry_id_option 'gnulinux' {
\tlinux /boot/vmlinuz-6.4.0-150600.21-default root=UUID=0000
}
submenu 'Advanced options for openSUSE Leap 15.6 (with Xen hypervisor)' {
\tmenuentry 'openSUSE Leap 15.6, with Xen 4.18 and Linux 6.4.0' --class xen {
\t\tmultiboot2 /boot/xen.gz
\t}
}
menuentry 'openSUSE Leap 15.6, with Xen hypervisor' --class opensuse --class xen {
\tmultiboot2 /boot/xen.gz placeholder dom0_mem=4096M,max:4096M
}
"""

# SLES 15 SP7's grub.cfg as YaST and grub2-mkconfig write it: GRUB_DISTRIBUTOR left empty, so the
# titles start with os-release's "${NAME} ${VERSION}" (SUSE's grub2-default-distributor.patch)
SP7_XEN_TITLE = "SLES 15-SP7, with Xen hypervisor"
SP7_GRUB_CFG = """\
set default="${saved_entry}"
menuentry 'SLES 15-SP7'  --class sles --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-0000' {
\tlinux /boot/vmlinuz-6.4.0-150700.51-default root=UUID=0000
}
submenu 'Advanced options for SLES 15-SP7' $menuentry_id_option 'gnulinux-advanced-0000' {
\tmenuentry 'SLES 15-SP7, with Linux 6.4.0-150700.51-default' --class sles {
\t\tlinux /boot/vmlinuz-6.4.0-150700.51-default root=UUID=0000
\t}
}
menuentry 'SLES 15-SP7, with Xen hypervisor' --class sles --class gnu-linux --class gnu --class os --class xen $menuentry_id_option 'xen-gnulinux-simple-0000' {
\tmultiboot2 /boot/xen.gz placeholder dom0_mem=4096M,max:4096M
}
submenu 'Advanced options for SLES 15-SP7 (with Xen hypervisor)' $menuentry_id_option 'gnulinux-advanced-0000' {
\tsubmenu 'Xen hypervisor, version 4.20.1_02-150700.3.3.1' {
\t\tmenuentry 'SLES 15-SP7, with Xen 4.20.1_02-150700.3.3.1 and Linux 6.4.0-150700.51-default' --class sles --class xen {
\t\t\tmultiboot2 /boot/xen-4.20.1_02-150700.3.3.1.gz placeholder
\t\t}
\t}
}
"""


def load(kind: str) -> ModuleType:
    return load_salt_module(kind, "storehost")


def test_xen_entry_is_the_top_level_xen_title(tmp_path: Path) -> None:
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(GRUB_CFG)
    assert load("_modules").xen_boot_entry(str(cfg)) == "openSUSE Leap 15.6, with Xen hypervisor"



def test_sles_15_sp7s_xen_entry_is_found_by_its_own_title(tmp_path: Path) -> None:
    """SP7's top-level Xen entry, not its plain entry, nor the per-version entries of the
    submenus, whatever its distribution's name."""
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(SP7_GRUB_CFG)
    assert load("_modules").xen_boot_entry(str(cfg)) == SP7_XEN_TITLE


def test_no_xen_entry_says_what_to_install(tmp_path: Path) -> None:
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(GRUB_CFG.split("submenu")[0])
    with pytest.raises(CommandExecutionError, match="patterns-server-xen_server"):
        load("_modules").xen_boot_entry(str(cfg))


def test_dom0_from_xen_capabilities(tmp_path: Path) -> None:
    caps = tmp_path / "capabilities"
    module = load("_modules")
    assert module.is_dom0(str(caps)) is False  # no Xen at all
    caps.write_text("")
    assert module.is_dom0(str(caps)) is False  # a domU
    caps.write_text("control_d\n")
    assert module.is_dom0(str(caps)) is True


def test_check_names_every_missing_part() -> None:
    module = load("_modules")
    # libvirt's in-process test driver stands in for the hypervisor's connection
    module.__salt__ = {"config.get": lambda key, default=None: (
        "test:///default" if key == "virt:connection:uri" else default)}
    assert module.check(driver="TEST", require_dom0=False, tools=["sh"]) == {
        "driver": "TEST", "dom0": False, "tools": ["sh"], "bridge": None, "devices": []}
    with pytest.raises(CommandExecutionError) as err:
        module.check(driver="Xen", require_dom0=True, tools=["sh", "no-such-xorriso"])
    message = str(err.value)
    assert "commands not found: no-such-xorriso (install their packages)" in message
    assert "devices missing" not in message
    assert "not running as Xen dom0" in message
    assert "libvirt reports the TEST driver, not Xen" in message


def test_check_wants_the_platforms_devices(tmp_path: Path) -> None:
    """sle16-kvm's check asks for /dev/kvm (parameters/platform/sle16-kvm.yaml `devices`): a
    missing one is named with its fix; one that is there passes."""
    module = load("_modules")
    module.__salt__ = {"config.get": lambda key, default=None: (
        "test:///default" if key == "virt:connection:uri" else default)}
    kvm = tmp_path / "kvm"
    with pytest.raises(CommandExecutionError) as err:
        module.check(driver="TEST", require_dom0=False, devices=[str(kvm)])
    assert str(err.value) == (f"hypervisor not ready: devices missing: {kvm} (their kernel "
                              "module is not loaded: hypervisor.kvm loads it, with "
                              "virtualization on in the firmware)")
    kvm.write_text("")
    assert module.check(driver="TEST", require_dom0=False, devices=[str(kvm)])["devices"] \
        == [str(kvm)]


def fake_ip(addresses: list[str], routes: list[dict[str, str]], bridge: str = "br0",
            ) -> dict[str, Any]:
    """`ip -j address|route show` output as the check runs it through cmd.run_all."""
    def run_all(cmd: list[str], **_kw: Any) -> dict[str, Any]:
        assert cmd[:2] == ["ip", "-j"]
        if cmd[2] == "address":
            if cmd[-1] != bridge:
                return {"retcode": 1, "stdout": "", "stderr": f'Device "{cmd[-1]}" does not exist.'}
            infos = [{"family": "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])}
                     for a in addresses]
            return {"retcode": 0, "stdout": json.dumps([{"ifname": bridge, "addr_info": infos}])}
        return {"retcode": 0, "stdout": json.dumps(routes)}

    return {"cmd.run_all": run_all}


STATIC = {"name": "br0", "bootproto": "static", "address": "10.42.0.10",
          "netmask": "255.255.255.0", "gateway": "10.42.0.1"}


@pytest.mark.parametrize(("addresses", "routes", "bridge", "problems"), [
    (["10.42.0.10/24"], [{"dst": "default", "gateway": "10.42.0.1", "dev": "br0"}], STATIC, []),
    # the old network state's failure: br0 switched to DHCP and got another address
    (["10.42.0.77/24"], [{"dst": "default", "gateway": "10.42.0.1", "dev": "br0"}], STATIC,
     ["bridge br0 has 10.42.0.77/24, not the inventory's static 10.42.0.10/24"]),
    ([], [], STATIC, ["bridge br0 has no IPv4 address, not the inventory's static 10.42.0.10/24",
                      "no default route via 10.42.0.1 on br0"]),
    (["10.42.0.10/24"], [{"dst": "default", "gateway": "10.42.0.1", "dev": "eth0"}], STATIC,
     ["no default route via 10.42.0.1 on br0"]),
    (["10.9.9.9/16"], [], {"name": "br0", "bootproto": "dhcp"}, []),
    ([], [], {"name": "br0", "bootproto": "dhcp"}, ["bridge br0 has no IPv4 address (DHCP)"]),
    (["10.42.0.10/24"], [], {"name": "br1", "bootproto": "dhcp"},
     ['bridge br1 missing (Device "br1" does not exist.)']),
])
def test_bridge_keeps_the_inventory_addressing(addresses: list[str], routes: list[dict[str, str]],
                                               bridge: dict[str, str],
                                               problems: list[str]) -> None:
    module = load("_modules")
    module.__salt__ = fake_ip(addresses, routes)
    assert module.bridge_problems(bridge) == problems


class FakeGrub:
    """grub2-editenv / grub2-set-default as the state calls them through __salt__."""

    def __init__(self, saved: str, entry: str) -> None:
        self.saved, self.entry, self.set_calls = saved, entry, []  # type: ignore[var-annotated]

    def salt(self) -> dict[str, Any]:
        def run(cmd: str, **_kw: Any) -> str:
            assert cmd == "grub2-editenv list"
            return f"saved_entry={self.saved}\n" if self.saved else ""

        def run_all(cmd: list[str], **_kw: Any) -> dict[str, Any]:
            assert cmd[0] == "grub2-set-default"
            self.set_calls.append(cmd[1])
            self.saved = cmd[1]
            return {"retcode": 0, "stdout": "", "stderr": ""}

        return {"cmd.run": run, "cmd.run_all": run_all,
                "storehost.xen_boot_entry": lambda _cfg: self.entry}


@pytest.mark.parametrize("test_mode", [False, True])
def test_default_boot_state_sets_the_xen_entry_once(test_mode: bool) -> None:
    grub = FakeGrub(saved="openSUSE Leap 15.6", entry="openSUSE Leap 15.6, with Xen hypervisor")
    state = load("_states")
    state.__salt__ = grub.salt()  # type: ignore[attr-defined]
    state.__opts__ = {"test": test_mode}  # type: ignore[attr-defined]
    ret = state.xen_default_boot("/boot/grub2/grub.cfg")
    assert ret["changes"] == {"saved_entry": {"old": "openSUSE Leap 15.6",
                                              "new": "openSUSE Leap 15.6, with Xen hypervisor"}}
    assert ret["result"] is (None if test_mode else True)
    assert grub.set_calls == ([] if test_mode else ["openSUSE Leap 15.6, with Xen hypervisor"])
    if not test_mode:  # the second run changes nothing
        again = state.xen_default_boot("/boot/grub2/grub.cfg")
        assert again["changes"] == {} and again["result"] is True
        assert grub.set_calls == ["openSUSE Leap 15.6, with Xen hypervisor"]


def test_checked_state_reads_only_and_reports_no_change_even_in_test_mode() -> None:
    """hypervisor.checks as a state: a plan's highstate test=True lists no pending change for
    it (a module.run would be "set to be executed" on every dry run)."""
    from salt.exceptions import CommandExecutionError

    def fine(**kw: Any) -> dict[str, Any]:
        return {"driver": kw["driver"], "dom0": kw["require_dom0"], "tools": [], "bridge": None,
                "devices": list(kw["devices"])}

    def missing(**_kw: Any) -> dict[str, Any]:
        raise CommandExecutionError("hypervisor not ready: not running as Xen dom0")

    for test in (False, True):
        state = load_salt_module("_states", "storehost", {"storehost.check": fine})
        state.__opts__ = {"test": test}  # type: ignore[attr-defined]
        ret = state.checked("ready", driver="Xen")
        assert (ret["result"], ret["changes"]) == (True, {}), ret
        assert ret["comment"] == "hypervisor ready: libvirt driver Xen, Xen dom0"
        # sle16-kvm's: its devices reach the check and are named
        ret = state.checked("ready", driver="QEMU", require_dom0=False, devices=["/dev/kvm"])
        assert (ret["result"], ret["changes"]) == (True, {}), ret
        assert ret["comment"] == "hypervisor ready: libvirt driver QEMU, /dev/kvm"
        state = load_salt_module("_states", "storehost", {"storehost.check": missing})
        state.__opts__ = {"test": test}  # type: ignore[attr-defined]
        ret = state.checked("ready")
        assert (ret["result"], ret["changes"]) == (False, {})
        assert "not running as Xen dom0" in ret["comment"]


def test_default_boot_state_boots_sles_15_sp7s_xen_entry(tmp_path: Path) -> None:
    """The state and the module together on SP7's grub.cfg: a host booting its plain SLES entry
    gets SP7's Xen entry as GRUB's saved entry, by its exact title."""
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(SP7_GRUB_CFG)
    grub = FakeGrub(saved="SLES 15-SP7", entry="")
    salt = grub.salt()
    salt["storehost.xen_boot_entry"] = load("_modules").xen_boot_entry
    state = load("_states")
    state.__salt__ = salt  # type: ignore[attr-defined]
    state.__opts__ = {"test": False}  # type: ignore[attr-defined]
    ret = state.xen_default_boot(str(cfg))
    assert ret["changes"] == {"saved_entry": {"old": "SLES 15-SP7", "new": SP7_XEN_TITLE}}
    assert ret["result"] is True and grub.set_calls == [SP7_XEN_TITLE]
