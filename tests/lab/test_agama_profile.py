"""A sle16-kvm host in the lab: Cobbler 3.3.10 boots it with Agama's `inst.auto=` and its own
profile URL, serves its Agama profile, and the simulated installer installs it; its minion runs
the Salt a sle16-kvm host runs (the lab's 3008, standing in for the Salt Bundle), a sles15-xen
host's 3006.

The first tests run their own cobblerd (tests/lab/test_lab_cobbler.py's fixture), the last the
session's lab. Needs root and `make setup`, as those do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import cobbler_service
from lab.agama import parse_agama
from lab.hardware import rack_inventory
from lab.state import LabInfo
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from tests.helpers import bmc_power, spec_parts, wait_for, write_inventory
from tests.lab import test_lab_cobbler
from tests.lab.test_lab_cobbler import MAC, Lab, _create_system, _get
from tests.unit.lab.agama_rules import problems

pytestmark = pytest.mark.lab
# test_lab_cobbler's fixture: this module runs a cobblerd of its own
cobbler_lab = test_lab_cobbler.cobbler_lab

AGAMA_PROFILE = "store-hypervisor-sle16-kvm"
SYSTEM = "store-0016-hv"
AGAMA_MAC = "52:54:00:16:00:01"


def _pxe_config(lab: Lab, mac: str) -> str:
    return (lab.cfg.upper("srv") / "tftpboot" / "pxelinux.cfg"
            / ("01-" + mac.replace(":", "-"))).read_text()


@pytest.fixture(scope="module")
def agama_system(cobbler_lab: Lab) -> str:
    """A sle16-kvm host's record as step 2 writes it (static address), and a sles15-xen host's
    beside it, both synced."""
    meta = {"salt_master": "10.42.0.5", "minion_id": SYSTEM, "store_id": "0016",
            "autosign_token": "tok-0016", "store_platform": "sle16-kvm",
            "install_product": "Leap_16.0", "virt_uri": "qemu:///system"}
    _create_system(cobbler_lab, SYSTEM, AGAMA_MAC, "192.0.2.16", netboot_enabled=True,
                   profile=AGAMA_PROFILE, autoinstall_meta=meta)
    _create_system(cobbler_lab, "store-0015-hv", MAC, "192.0.2.15", netboot_enabled=True)
    proxy, token = cobbler_lab.login()
    assert proxy.sync(token)
    return SYSTEM


def test_each_platform_has_its_profile_on_its_installers_distro(cobbler_lab: Lab) -> None:
    proxy, _ = cobbler_lab.login()
    agama: dict[str, Any] = proxy.get_profile(AGAMA_PROFILE)  # type: ignore[assignment]
    assert agama["distro"] == cobbler_service.AGAMA_DISTRO
    assert agama["autoinstall"] == "sle16-kvm.json"
    distro: dict[str, Any] = proxy.get_distro(cobbler_service.AGAMA_DISTRO)  # type: ignore[assignment]
    assert (distro["breed"], distro["os_version"]) == ("suse", "opensuse16.0")
    xen: dict[str, Any] = proxy.get_profile(cobbler_service.PROFILE)  # type: ignore[assignment]
    assert xen["distro"] == cobbler_service.DISTRO
    # the profile alone (no system): Agama's JSON, root locked
    alone = json.loads(proxy.generate_autoinstall(AGAMA_PROFILE, ""))
    assert problems(alone) == [] and alone["root"] == {"hashedPassword": True, "password": "!"}


def test_a_sle16_kvm_systems_pxe_config_boots_agama_with_its_own_profile(
        cobbler_lab: Lab, agama_system: str) -> None:
    """Cobbler writes Agama's `inst.auto=` with the system's own autoinstall URL (no
    `autoyast=`), and the profile's kernel options; a sles15-xen system keeps `autoyast=`."""
    pxe = _pxe_config(cobbler_lab, AGAMA_MAC)
    url = f"{cobbler_lab.cfg.http_url}/cblr/svc/op/autoinstall/system/{agama_system}"
    assert re.search(rf"\sinst\.auto={re.escape(url)}(\s|$)", pxe), pxe
    assert "autoyast=" not in pxe
    assert " console=ttyS0" in pxe and " net.ifnames=0" in pxe
    assert f"kernel /images/{cobbler_service.AGAMA_DISTRO}/" in pxe
    xen = _pxe_config(cobbler_lab, MAC)
    assert "autoyast=" in xen and "inst.auto=" not in xen


def test_cobbler_serves_the_systems_agama_profile_and_its_nopxe_works(
        cobbler_lab: Lab, agama_system: str) -> None:
    status, served = _get(f"{cobbler_lab.cfg.http_url}/cblr/svc/op/autoinstall/system/"
                          f"{agama_system}")
    assert status == 200
    assert problems(json.loads(served)) == []
    install = parse_agama(served)
    conf = yaml.safe_load(install.files["/etc/venv-salt-minion/minion.d/50-store-rollout.conf"])
    assert conf["grains"]["store_rollout_platform"] == "sle16-kvm"
    assert conf["grains"]["store_rollout_bridge"]["address"] == "192.0.2.16"
    assert json.loads(served)["product"] == {"id": "Leap_16.0"}
    proxy, _ = cobbler_lab.login()
    assert install.nopxe_url and install.nopxe_url.endswith(f"/nopxe/system/{agama_system}")
    assert _get(install.nopxe_url) == (200, "True")
    assert proxy.get_system(agama_system)["netboot_enabled"] is False


def test_each_platforms_host_runs_its_platforms_salt(lab: LabInfo, lab_env: dict[str, str],
                                                      tmp_path: Path) -> None:
    """A sle16-kvm store's host, installed by the simulated installer from the Agama profile
    Cobbler served, signs in with its token and answers `test.version` through the master with
    3008 (the lab's stand-in for the Salt Bundle); a sles15-xen store's, from the AutoYaST
    profile, with 3006."""
    from tasks.cobbler import CobblerClient, system_spec
    from tasks.salt import SaltMasterClient

    path = write_inventory(tmp_path / "inv.yaml", ["agama-kvm", "agama-xen"], "52:54:00:a6:00")
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    raw["stores"][0]["hypervisor"]["platform"] = "sle16-kvm"
    raw["stores"][1]["hypervisor"]["platform"] = "sles15-xen"
    path.write_text(yaml.safe_dump(raw))
    rack_inventory(lab, path)
    salt, hosts = spec_parts(load_settings(lab_env))
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    master = SaltMasterClient(lab.salt_master_config)
    stores = load_inventory(path).stores
    try:
        for store in stores:  # what step 2 does, without its waits and checks
            token = master.issue_token(store.hypervisor_minion_id)
            assert cobbler.upsert_system(system_spec(store, salt, hosts, token))
            cobbler.sync_system(store.cobbler_system)
            bmc_power(lab, store.cobbler_system, "on")
        versions: dict[str | None, str] = {}
        for store in stores:
            minion = store.hypervisor_minion_id
            wait_for(lambda m=minion: master.key_state(m) == "accepted", timeout=120,
                     interval=1, what=f"{minion}'s key accepted")
            versions[store.hypervisor.platform] = str(wait_for(
                lambda m=minion: _version(master, m), timeout=60, interval=2,
                what=f"{minion} answering test.version"))
    finally:
        for store in stores:
            bmc_power(lab, store.cobbler_system, "off")
    assert versions["sle16-kvm"].startswith("3008."), versions
    assert versions["sles15-xen"].startswith("3006."), versions


def _version(master: Any, minion: str) -> str | None:
    try:
        return str(master.cmd(minion, "test.version", timeout=10))
    except Exception:  # not answering yet (its first start, its startup highstate)
        return None
