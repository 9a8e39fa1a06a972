"""The Agama profile of a sle16-kvm host (image_builds/agama/sle16-kvm.json), rendered as Cobbler
3.3 renders it (its own template class, as tests/unit/salt_states/test_salt_render.py does), for
a store with static addressing, one on DHCP and the profile alone (no system): valid JSON that
follows the rules of Agama's profile schema (tests/unit/lab/agama_rules.py), carrying what the
AutoYaST profile of sles15-xen carries; and the lab simulator's reader of it (lab/agama.py,
lab/simulator/installed_host.py).

The render is also checked against the real schema when STORE_ROLLOUT_AGAMA_SCHEMA_DIR names a
directory holding agama-project/agama's schema files (`profile.schema.json` and the files it
$refs: rust/agama-lib/share/ on branch SLE-16, or rust/share/ on master); skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.agama import parse_agama, parse_profile
from lab.simulator.installed_host import installed_minion
from lab.state import PLATFORM_SALT_BIN, REPO_ROOT, SALT_STATES_DIR, VENV_BIN
from store_rollout.contracts import (
    AUTOSIGN_GRAIN,
    BRIDGE_GRAIN,
    LIBVIRT_EVENTS_CONF,
    LIBVIRT_EVENTS_ENGINE,
    MINION_LINK_CONF,
    STORE_PLATFORM_GRAIN,
)
from store_rollout.platforms import PLATFORMS
from tests.unit.lab.agama_rules import problems
from tests.unit.salt_states.test_salt_render import COBBLER_PYTHON, COBBLER_RENDER
from tests.unit.tasks.test_root_password import COBBLER_DEFAULT_HASH

IMAGES = REPO_ROOT / "image_builds"
AGAMA = IMAGES / PLATFORMS["sle16-kvm"].template
AUTOYAST = IMAGES / PLATFORMS["sles15-xen"].template
ENGINE = SALT_STATES_DIR / "_engines" / f"{LIBVIRT_EVENTS_ENGINE}.py"
BUNDLE = "/etc/venv-salt-minion"
SYSTEM = "store-0042-hv"
MAC = "52:54:00:42:00:01"
# step 2's autoinstall_meta (tasks/cobbler/systems.system_spec) plus Cobbler's blended vars
META = {"salt_master": "10.42.0.5", "salt_master_port": "14506", "salt_publish_port": "14505",
        "minion_id": SYSTEM, "store_id": "0042", "autosign_grain": AUTOSIGN_GRAIN,
        "autosign_token": "tok-0042-a1b2c3", "store_platform": "sle16-kvm",
        "install_product": "SLES", "registration_url": "https://rmt.example",
        "registration_code": "REG-CODE-42", "virt_uri": "qemu:///system",
        "vm_images_dir": "/srv/store-vm-images",
        "master_finger": "3a:9f:" + ":".join(["0c"] * 30), "master_hash_type": "sha256",
        "update_repos": "update-1=https://updates.example/sle16/ update-2=https://tools.example/"}
COBBLER_VARS = {"hostname": f"{SYSTEM}.stores.example", "http_server": "10.42.0.2:8080",
                # Cobbler blends its settings in: the profile must never fall back to this one
                "default_password_crypted": COBBLER_DEFAULT_HASH}
STATIC: dict[str, Any] = {**META, **COBBLER_VARS, "system_name": SYSTEM, "gateway": "10.42.0.1",
          "name_servers": ["10.42.0.53", "10.42.0.54"],
          "interfaces": {"eth0": {"mac_address": MAC, "static": True, "ip_address": "10.42.0.10",
                                  "netmask": "255.255.255.0"}}}
DHCP: dict[str, Any] = {**META, **COBBLER_VARS, "system_name": SYSTEM, "install_product": "Leap_16.0",
        "interfaces": {"eth0": {"mac_address": MAC, "static": False}}}
# the hypervisor formula's libvirt parameters of the platform (packages, units)
FORMULA: dict[str, Any] = yaml.safe_load(
    (SALT_STATES_DIR / "hypervisor" / "parameters" / "platform" / "sle16-kvm.yaml").read_text()
)["values"]["libvirt"]
CASES: dict[str, dict[str, Any]] = {"static": STATIC, "dhcp": DHCP, "no-system": COBBLER_VARS}


SNIPPETS: list[Path] = []  # the snippets dir of this module's renders (set by its fixture)


@pytest.fixture(scope="module", autouse=True)
def _snippets(tmp_path_factory: pytest.TempPathFactory) -> None:
    # as the lab and an operator install it: the engine module itself is Cobbler's snippet
    snippets = tmp_path_factory.mktemp("snippets")
    (snippets / ENGINE.name).write_text(ENGINE.read_text())
    SNIPPETS[:] = [snippets]


# what cobblerd does first (cobbler.templar.Templar.render): refuse a template whose text has an
# import outside its setting cheetah_import_whitelist (3.3.10's default), comments included
COBBLER_IMPORT_CHECK = """
import json, sys, types
from cobbler.templar import Templar
settings = types.SimpleNamespace(cheetah_import_whitelist=["re", "random", "time"])
Templar.check_for_invalid_imports(types.SimpleNamespace(settings=settings),
                                  json.loads(sys.stdin.read())["template"])
"""


def render_text(template: Path, variables: dict[str, Any]) -> str:
    """`template` rendered as cobblerd renders it: its import check, then its own template
    class with `variables`."""
    if not COBBLER_PYTHON.exists():
        pytest.fail(f"{COBBLER_PYTHON} missing: `make setup` builds .venv-cobbler")
    checked = subprocess.run([str(COBBLER_PYTHON), "-c", COBBLER_IMPORT_CHECK],
                             input=json.dumps({"template": template.read_text()}),
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr[-3000:]
    proc = subprocess.run([str(COBBLER_PYTHON), "-c", COBBLER_RENDER], input=json.dumps(
        {"template": template.read_text(),
         "vars": {"autoinstall_snippets_dir": str(SNIPPETS[0]), **variables}}),
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@cache
def rendered(case: str) -> str:
    return render_text(AGAMA, CASES[case])


def profile(case: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(rendered(case))
    return loaded


def files(case: str) -> dict[str, str]:
    return {f["destination"]: f["content"] for f in profile(case)["files"]}


def post_scripts(case: str) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in profile(case)["scripts"]["post"]}


@pytest.mark.parametrize("case", CASES)
def test_the_render_is_json_that_follows_agamas_schema_rules(case: str) -> None:
    assert problems(json.loads(rendered(case))) == []


def test_the_rules_refuse_what_agamas_schema_refuses() -> None:
    """The structural check can fail: a key Agama does not know (at the top, in a file entry),
    a file with two sources, AutoYaST's "max" as a size, a method NetworkManager lacks, a
    script without a name."""
    broken = profile("static")
    broken["partitioning"] = []
    broken["files"][0]["mode"] = "600"
    broken["files"][1]["url"] = "http://x/y"
    broken["storage"]["drives"][0]["partitions"][2]["size"] = "max"
    broken["network"]["connections"][1]["method4"] = "static"
    del broken["scripts"]["post"][0]["name"]
    found = problems(broken)
    for said in ("/: key 'partitioning' is not allowed", "/files/0: key 'mode' is not allowed",
                 "/files/1: exactly one of url, content", "/partitions/2/size: a size",
                 "/network/connections/1/method4: not one of",
                 "/scripts/post/0: required key 'name' missing"):
        assert any(said in p for p in found), (said, found)
    assert problems({"product": {}}) == ["/product: required key 'id' missing"]


def test_product_and_registration_only_for_sles() -> None:
    assert profile("static")["product"] == {"id": "SLES", "registrationUrl": "https://rmt.example",
                                            "registrationCode": "REG-CODE-42"}
    # Leap registers nowhere, whatever the record holds
    assert profile("dhcp")["product"] == {"id": "Leap_16.0"}
    assert set(PLATFORMS["sle16-kvm"].products.values()) == {"SLES", "Leap_16.0"}


def test_root_is_the_stores_own_or_locked_never_cobblers_default() -> None:
    assert profile("static")["root"] == {"hashedPassword": True, "password": "!"}
    with_hash = json.loads(render_text(AGAMA, {**STATIC, "root_password_hash": "$6$s$own"}))
    assert with_hash["root"] == {"hashedPassword": True, "password": "$6$s$own"}
    for case in CASES:
        assert COBBLER_DEFAULT_HASH not in rendered(case)


def test_whole_first_disk_swap_and_root() -> None:
    assert profile("static")["storage"] == {"drives": [{"partitions": [
        {"search": "*", "delete": True},
        {"filesystem": {"path": "swap", "type": "swap"}, "size": "4 GiB"},
        {"filesystem": {"path": "/", "type": "ext4"}, "size": {"min": "20 GiB"}}]}]}


def test_bridge_br0_on_the_first_nic_static() -> None:
    port, bridge = profile("static")["network"]["connections"]
    assert port == {"id": "eth0", "interface": "eth0", "macAddress": MAC}
    assert bridge == {"id": "br0", "interface": "br0", "customMacAddress": MAC,
                      "method4": "manual", "addresses": ["10.42.0.10/24"],
                      "gateway4": "10.42.0.1", "nameservers": ["10.42.0.53", "10.42.0.54"],
                      "bridge": {"stp": False, "forwardDelay": 0, "ports": ["eth0"]}}
    wide = {**STATIC, "interfaces": {"eth0": {**STATIC["interfaces"]["eth0"],
                                              "netmask": "255.255.240.0"}}}
    connections = json.loads(render_text(AGAMA, wide))["network"]["connections"]
    assert connections[1]["addresses"] == ["10.42.0.10/20"]
    # the interface names the profile uses are the kernel's with net.ifnames=0
    assert profile("static")["bootloader"] == {"timeout": 5, "extraKernelParams": "net.ifnames=0"}


def test_bridge_on_dhcp_and_without_a_system() -> None:
    _, bridge = profile("dhcp")["network"]["connections"]
    assert bridge["method4"] == "auto" and "addresses" not in bridge
    assert bridge["bridge"]["ports"] == ["eth0"]
    assert profile("no-system")["network"]["connections"] == [
        {"id": "br0", "interface": "br0", "method4": "auto",
         "bridge": {"stp": False, "forwardDelay": 0, "ports": []}}]


def test_kvm_packages_the_salt_bundle_and_update_repositories() -> None:
    software = profile("static")["software"]
    assert {"libvirt-daemon-driver-qemu", "qemu-kvm", "libvirt-client", "python3-libvirt-python",
            "qemu-tools", "xorriso", "curl", "venv-salt-minion"} <= set(software["packages"])
    # and every package the hypervisor formula installs on the platform, before its highstate
    assert set(FORMULA["pkgs"]) <= set(software["packages"])
    assert "salt-minion" not in software["packages"]  # SLE 16 has none
    assert software["extraRepositories"] == [
        {"alias": "update-1", "name": "update-1", "url": "https://updates.example/sle16/"},
        {"alias": "update-2", "name": "update-2", "url": "https://tools.example/"}]
    assert "extraRepositories" not in profile("no-system")["software"]


def test_the_minion_config_and_grains() -> None:
    written = files("static")
    assert written[f"{BUNDLE}/minion_id"] == f"{SYSTEM}\n"
    conf = yaml.safe_load(written[f"{BUNDLE}/minion.d/50-store-rollout.conf"])
    assert {k: conf[k] for k in ("master", "master_port", "publish_port", "id")} == {
        "master": "10.42.0.5", "master_port": 14506, "publish_port": 14505, "id": SYSTEM}
    assert conf["grains"] == {
        "role": "hypervisor", "store_id": "0042", STORE_PLATFORM_GRAIN: "sle16-kvm",
        AUTOSIGN_GRAIN: "tok-0042-a1b2c3",
        BRIDGE_GRAIN: {"name": "br0", "bootproto": "static", "address": "10.42.0.10",
                       "netmask": "255.255.255.0", "gateway": "10.42.0.1"}}
    assert conf["autosign_grains"] == [AUTOSIGN_GRAIN]
    assert conf["master_finger"] == META["master_finger"] and conf["hash_type"] == "sha256"
    assert conf["startup_states"] == "highstate"
    assert conf["virt"] == {"connection": {"uri": "qemu:///system"},
                            "images": "/srv/store-vm-images"}
    dhcp = yaml.safe_load(files("dhcp")[f"{BUNDLE}/minion.d/50-store-rollout.conf"])
    assert dhcp["grains"][BRIDGE_GRAIN] == {"name": "br0", "bootproto": "dhcp"}
    assert "master_finger" not in yaml.safe_load(
        files("no-system")[f"{BUNDLE}/minion.d/50-store-rollout.conf"])
    # without a virt_uri in the record, the platform's
    alone = yaml.safe_load(files("no-system")[f"{BUNDLE}/minion.d/50-store-rollout.conf"])
    assert alone["virt"]["connection"]["uri"] == PLATFORMS["sle16-kvm"].libvirt_uri


def test_the_engine_file_and_module_as_the_autoyast_profile_writes_them() -> None:
    """The engine's minion.d file is the AutoYaST profile's text (the formula's events concern
    manages the same), with the host's URI; the engine module is the formula's, byte for byte,
    where the pinned extension_modules puts the minion's modules."""
    written = files("static")
    autoyast = parse_profile(render_text(AUTOYAST, {**STATIC, "virt_uri": "qemu:///system"}))
    assert autoyast.installer == "autoyast"
    assert written[f"{BUNDLE}/minion.d/{LIBVIRT_EVENTS_CONF}"] \
        == autoyast.files[f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}"]
    extmods = yaml.safe_load(written[f"{BUNDLE}/minion.d/50-store-rollout.conf"])[
        "extension_modules"]
    assert written[f"{extmods}/engines/{ENGINE.name}"] == ENGINE.read_text()
    permissions = {f["destination"]: f["permissions"] for f in profile("static")["files"]}
    assert permissions[f"{BUNDLE}/minion.d/50-store-rollout.conf"] == "0600"  # the token


def test_post_scripts_enable_the_units_and_call_nopxe_with_a_system() -> None:
    scripts = post_scripts("static")
    enable = scripts["10-enable-salt-minion"]
    assert enable["chroot"] is True and enable["content"].startswith("#!/bin/sh\n")
    lines = enable["content"].splitlines()
    # the units the hypervisor formula enables and masks on the platform, from the install on
    assert " ".join(["systemctl enable sshd.service venv-salt-minion.service",
                     *FORMULA["enabled"]]) in lines
    assert " ".join(["systemctl mask", *FORMULA["masked"]]) in lines
    assert "virtqemud-ro.socket" in FORMULA["enabled"]
    nopxe = scripts["99-cobbler-nopxe"]
    assert nopxe["chroot"] is False and nopxe["content"].startswith("#!/bin/sh\n")
    assert f'url="http://10.42.0.2:8080/cblr/svc/op/nopxe/system/{SYSTEM}"' in nopxe["content"]
    assert '"$answer" != "True"' in nopxe["content"]  # Cheetah's \$ became the shell's $
    assert list(post_scripts("no-system")) == ["10-enable-salt-minion"]


def test_the_simulators_reader_on_the_render() -> None:
    """lab/agama.py reads a rendered profile into what the simulator installs, as
    parse_autoyast does for AutoYaST; the installed minion is the Bundle's, a sle16-kvm host,
    whose Salt in the lab is the project's 3008 (the AutoYaST one's 3006)."""
    install = parse_profile(rendered("static"))
    assert install == parse_agama(rendered("static")) and install.installer == "agama"
    assert install.nopxe_url == f"http://10.42.0.2:8080/cblr/svc/op/nopxe/system/{SYSTEM}"
    host = installed_minion(install.files, install.installer)
    assert (host.config_dir, host.minion_id, host.platform) == (BUNDLE, SYSTEM, "sle16-kvm")
    assert set(host.minion_d) == {"50-store-rollout.conf", LIBVIRT_EVENTS_CONF,
                                  MINION_LINK_CONF}
    assert list(host.extmods) == [f"/var/cache/venv-salt-minion/extmods/engines/{ENGINE.name}"]
    assert PLATFORM_SALT_BIN[host.platform] == VENV_BIN
    # the full lab's disk (no profile at hand): judged by the Bundle's directory
    assert installed_minion(install.files).platform == "sle16-kvm"
    assert parse_profile(rendered("no-system")).nopxe_url is None
    xen = {**STATIC, "store_platform": "sles15-xen", "virt_uri": "xen:///system"}
    old = installed_minion(parse_profile(render_text(AUTOYAST, xen)).files, "autoyast")
    assert (old.config_dir, old.minion_id, old.platform) == ("/etc/salt", SYSTEM, "sles15-xen")
    assert PLATFORM_SALT_BIN[old.platform] != VENV_BIN
    # the platform is the profile's grain; a profile naming none is its installer's platform
    unnamed = {p: t.replace("store_rollout_platform: 'sle16-kvm'", "")
               for p, t in install.files.items()}
    assert installed_minion(unnamed, "agama").platform == "sle16-kvm"
    assert installed_minion(unnamed, "autoyast").platform == "sles15-xen"
    assert list(old.extmods) == [f"/var/cache/salt/minion/extmods/engines/{ENGINE.name}"]


@pytest.mark.parametrize(("text", "said"), [
    ("{not json", "not valid JSON"),
    ('{"files": []}', "no `product` object"),
    ('{"product": {"id": "SLES"}, "files": [{"content": "x"}]}', "files[0] has no destination"),
    ('{"product": {"id": "SLES"}, "files": [{"destination": "/etc/x", "url": "http://y/"}]}',
     "files[0] (/etc/x) has no inline content"),
])
def test_the_reader_refuses_what_is_no_agama_profile(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        parse_agama(text)


SCHEMA_DIR = os.environ.get("STORE_ROLLOUT_AGAMA_SCHEMA_DIR", "")


@pytest.mark.skipif(not SCHEMA_DIR, reason="STORE_ROLLOUT_AGAMA_SCHEMA_DIR names no directory of "
                    "Agama's schema files (profile.schema.json and the files it $refs)")
@pytest.mark.parametrize("case", CASES)
def test_the_render_against_agamas_own_schema(case: str) -> None:
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT201909

    schemas = {f.name: json.loads(f.read_text()) for f in Path(SCHEMA_DIR).glob("*.schema.json")}
    assert "profile.schema.json" in schemas, f"no profile.schema.json in {SCHEMA_DIR}"
    registry: Registry[Any] = Registry().with_resources(
        (uri, Resource.from_contents(contents, default_specification=DRAFT201909))
        for name, contents in schemas.items() for uri in (name, contents.get("$id", name)))
    validator = jsonschema.Draft201909Validator(schemas["profile.schema.json"],
                                                registry=registry)
    errors = [f"{list(e.absolute_path)}: {e.message}"
              for e in validator.iter_errors(json.loads(rendered(case)))]
    assert errors == []
