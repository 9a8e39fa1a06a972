"""The Salt states as each platform renders them (issue 13): production Leap 15.6 Xen grains
render every production state, the lab's Debian grains with the lab pillar render the lab's.

Rendered with the real `salt-call --local state.show_highstate` against `salt_states/`, with the
platform's grains; compared with a reviewed snapshot in tests/snapshots/. After a deliberate change:
`STORE_ROLLOUT_UPDATE_SNAPSHOTS=1 pytest tests/unit/salt_states/test_salt_render.py`, then review
the diff.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.autoyast import parse_autoyast
from lab.state import LAB_FILE_ROOTS, REPO_ROOT, SALT_STATES_DIR, VENV_BIN
from store_rollout.contracts import (
    LIBVIRT_EVENT_TAG_PREFIX,
    LIBVIRT_EVENTS_CONF,
    LIBVIRT_EVENTS_ENGINE,
)

SNAPSHOTS = REPO_ROOT / "tests" / "snapshots"
LEAP_15_6 = {"os": "Leap", "os_family": "Suse", "osfullname": "Leap", "osrelease": "15.6",
             "osfinger": "Leap-15", "oscodename": "openSUSE Leap 15.6", "kernel": "Linux",
             "virtual": "physical"}
DEBIAN_12 = {"os": "Debian", "os_family": "Debian", "osfullname": "Debian", "osrelease": "12",
             "osfinger": "Debian-12", "oscodename": "bookworm", "kernel": "Linux",
             "virtual": "physical"}
# as the AutoYaST profile writes it for a store with static addressing (test_lab_cobbler)
BRIDGE_GRAIN = {"name": "br0", "bootproto": "static", "address": "10.42.0.10",
                "netmask": "255.255.255.0", "gateway": "10.42.0.1"}
PLATFORMS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (minion id, grains, pillar)
    "hypervisor-leap-15.6-xen": ("store-0042-hv", {**LEAP_15_6, "role": "hypervisor",
                                                   "store_id": "0042",
                                                   "store_rollout_bridge": BRIDGE_GRAIN}, {}),
    "store-vm-leap-15.6": ("store-0042-vm", {**LEAP_15_6, "role": "store-server",
                                             "store_id": "0042"}, {}),
    "hypervisor-lab-debian-12": ("store-0042-hv", {**DEBIAN_12, "role": "hypervisor",
                                                   "store_id": "0042"},
                                 {"hypervisor": {"os_family": "Debian"}}),
}
# what the lab's master serves: its overlay (lab/salt_overlay) ahead of salt_states/
ROOTS = {name: LAB_FILE_ROOTS if "-lab-" in name else (SALT_STATES_DIR,) for name in PLATFORMS}


def render(tmp: Path, minion_id: str, grains: dict[str, Any], pillar: dict[str, Any],
           roots: tuple[Path, ...] = (SALT_STATES_DIR,)) -> dict[str, Any]:
    (tmp / "pillar").mkdir(parents=True)
    (tmp / "pillar" / "top.sls").write_text("base:\n  '*':\n    - data\n")
    (tmp / "pillar" / "data.sls").write_text(yaml.safe_dump(pillar or {"none": None}))
    (tmp / "minion").write_text(yaml.safe_dump({
        "file_client": "local", "root_dir": str(tmp / "root"), "id": minion_id,
        "file_roots": {"base": [str(root) for root in roots]},
        "pillar_roots": {"base": [str(tmp / "pillar")]}, "grains": grains}))
    # custom modules first, as a highstate (autoload_dynamic_modules) syncs them on a minion
    subprocess.run([str(VENV_BIN / "salt-call"), "--local", "-c", str(tmp), "saltutil.sync_all"],
                   capture_output=True, text=True, timeout=120, check=True)
    proc = subprocess.run([str(VENV_BIN / "salt-call"), "--local", "-c", str(tmp),
                           "state.show_highstate", "--out", "json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the render's private root_dir stands for / (a real minion's root_dir), its config dir for
    # /etc/salt
    rendered: dict[str, Any] = json.loads(
        proc.stdout.replace(str(tmp / "root"), "").replace(str(tmp), "/etc/salt"))["local"]
    assert isinstance(rendered, dict), f"render failed: {rendered}"
    return rendered


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_rendered_highstate_matches_reviewed_snapshot(platform: str, tmp_path: Path) -> None:
    rendered = render(tmp_path, *PLATFORMS[platform], ROOTS[platform])
    text = json.dumps(rendered, indent=1, sort_keys=True) + "\n"
    snapshot = SNAPSHOTS / f"{platform}.json"
    if os.environ.get("STORE_ROLLOUT_UPDATE_SNAPSHOTS"):
        snapshot.write_text(text)
    expected = snapshot.read_text() if snapshot.exists() else ""
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                        str(snapshot), f"{platform} now", n=2))
    assert not diff, (f"the rendered highstate for {platform} changed; review it and rerun with "
                      f"STORE_ROLLOUT_UPDATE_SNAPSHOTS=1:\n{diff[:6000]}")


def _states(rendered: dict[str, Any], module: str) -> dict[str, list[Any]]:
    return {sid: body[module] for sid, body in rendered.items() if module in body}


def _args(call: list[Any]) -> dict[str, Any]:
    return {k: v for item in call if isinstance(item, dict) for k, v in item.items()}


def test_production_hypervisor_boots_xen_runs_modular_libvirt_and_checks_dom0(
        tmp_path: Path) -> None:
    rendered = render(tmp_path, *PLATFORMS["hypervisor-leap-15.6-xen"])
    # the Xen entry becomes the saved default, by its title in grub.cfg
    default = _states(rendered, "storehost")["hypervisor-xen-init-storehost-xen-default-boot"]
    assert "xen_default_boot" in default and _args(default)["name"] == "/boot/grub2/grub.cfg"
    assert _args(_states(rendered, "file")["hypervisor-xen-init-file-replace"])["repl"] \
        == "GRUB_DEFAULT=saved"
    # one reboot while the host is not Xen dom0 yet
    reboot = _args(_states(rendered, "cmd")["hypervisor-xen-dom0-cmd-run"])
    assert reboot["name"].startswith("shutdown -r")
    assert reboot["unless"] == "grep -qs control_d /proc/xen/capabilities"
    # libvirt's modular daemons; the monolithic libvirtd masked (one Xen driver)
    services = _states(rendered, "service")
    running = {_args(c)["name"] for c in services.values() if "running" in c}
    masked = {_args(c)["name"] for c in services.values() if "masked" in c}
    assert "virtxend.socket" in running and "libvirtd.service" in masked
    # Salt's libvirt_events engine connects read-only (libvirt.openReadOnly): virtxend's ro socket
    assert "virtxend-ro.socket" in running
    assert not running & masked
    assert "python3-libvirt-python" in _args(
        _states(rendered, "pkg")["hypervisor-libvirt-init-pkg-installed"])["pkgs"]
    # "ready" needs dom0 and the Xen driver; nothing rewrites br0 (AutoYaST built it)
    check = _args(_states(rendered, "storehost")["hypervisor-checks-init-storehost-checked"])
    assert {k: check[k] for k in ("driver", "require_dom0", "tools", "bridge")} == {
        "driver": "Xen", "require_dom0": True, "tools": ["qemu-img", "xorriso"],
        "bridge": BRIDGE_GRAIN}
    assert not _states(rendered, "network")
    assert not any("virt" in body and "keys" in body["virt"] for body in rendered.values())


def test_lab_hypervisor_changes_nothing_on_the_host(tmp_path: Path) -> None:
    rendered = render(tmp_path, *PLATFORMS["hypervisor-lab-debian-12"], LAB_FILE_ROOTS)
    modules = {m for body in rendered.values() for m in body if not m.startswith("__")}
    # events (its file, a restart on change), checks, ready
    assert modules == {"file", "module", "storehost", "grains", "event"}, modules
    # the one file it writes is in the minion's own config dir (the lab's state dir)
    files = {_args(body)["name"] for body in _states(rendered, "file").values()}
    assert files == {f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}"}, files
    check = _args(_states(rendered, "storehost")["hypervisor-checks-init-storehost-checked"])
    assert {k: check[k] for k in ("driver", "require_dom0", "tools", "bridge")} == {
        "driver": "QEMU", "require_dom0": False, "tools": ["qemu-img", "xorriso"],
        "bridge": None}


def test_the_formula_manages_the_engine_file_autoyast_writes(tmp_path: Path) -> None:
    """hypervisor.events manages the libvirt_events minion.d file the AutoYaST profile wrote at
    install: the same text (for Leap 15.6's xen:///system), or the first highstate of every new
    host would rewrite it and restart its minion."""
    rendered = render(tmp_path, *PLATFORMS["hypervisor-leap-15.6-xen"])
    managed = _args(_states(rendered, "file")["hypervisor-events-init-file-managed"])
    assert managed["name"] == f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}"
    profile = (REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml").read_text()
    written = re.search(rf"<file_path>/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}</file_path>.*?"
                        r"<!\[CDATA\[(.*?)\]\]>", profile, re.S)
    assert written is not None
    # Cobbler fills in the virt URI it got from step 2 (Leap: the default, xen:///system)
    text = written.group(1).replace("$getVar('virt_uri', 'xen:///system')", "xen:///system")
    assert managed["contents"] == text
    assert yaml.safe_load(text)["engines"][0][LIBVIRT_EVENTS_ENGINE]["tag_prefix"] \
        == LIBVIRT_EVENT_TAG_PREFIX


COBBLER_PYTHON = Path(os.environ.get("STORE_ROLLOUT_COBBLER_VENV",
                                     REPO_ROOT / ".venv-cobbler")) / "bin" / "python"
# Cobbler 3.3's own rendering (cobbler.templar.Templar.render_cheetah): its template class, which
# resolves $SNIPPET from autoinstall_snippets_dir, with errorCatcher ListErrors
COBBLER_RENDER = """
import json, sys
from cobbler.template_api import CobblerTemplate
spec = json.load(sys.stdin)
template = CobblerTemplate.compile(
    moduleName="cobbler.template_api", className="CobblerDynamicTemplate",
    source="#errorCatcher ListErrors\\n" + spec["template"],
    compilerSettings={"useStackFrame": False}, baseclass=CobblerTemplate)
sys.stdout.write(str(template(searchList=[spec["vars"]])))
"""


def test_autoyast_writes_the_engine_module_the_formula_syncs(tmp_path: Path) -> None:
    """The minion loads engines only when it starts, before the first highstate syncs
    `_engines`: the profile writes the engine module into the minion's extension modules (its
    directory first: YaST makes a path ending in "/" with its parents, a file only into an
    existing directory), from the Cobbler snippet that is the module itself. Rendered as
    Cobbler renders it, the file is the formula's module, byte for byte, so the first sync
    finds nothing to replace and the engine runs from the first start on."""
    if not COBBLER_PYTHON.exists():
        pytest.fail(f"{COBBLER_PYTHON} missing: `make setup` builds .venv-cobbler")
    module = SALT_STATES_DIR / "_engines" / f"{LIBVIRT_EVENTS_ENGINE}.py"
    snippets = tmp_path / "snippets"
    snippets.mkdir()
    (snippets / module.name).write_text(module.read_text())  # as the lab and an operator install it
    profile = (REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml").read_text()
    proc = subprocess.run([str(COBBLER_PYTHON), "-c", COBBLER_RENDER], input=json.dumps(
        {"template": profile, "vars": {"autoinstall_snippets_dir": str(snippets),
                                       "store_minion_id": "store-0042-hv"}}),
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = parse_autoyast(proc.stdout).files
    extmods = "/var/cache/salt/minion/extmods/engines/"
    paths = list(files)
    assert extmods in paths and paths.index(extmods) < paths.index(extmods + module.name)
    assert files[extmods + module.name] == module.read_text()
    engine = yaml.safe_load(files[f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}"])["engines"][0]
    assert list(engine) == [LIBVIRT_EVENTS_ENGINE]


def test_autoyast_enables_and_masks_the_formulas_libvirt_units() -> None:
    """The profile's chroot script enables and masks at install the units the formula manages
    (parameters/os_family/Suse.yaml), so the first boot into Xen already has them, the
    libvirt_events engine's read-only socket included."""
    profile = (REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml").read_text()
    suse = yaml.safe_load((SALT_STATES_DIR / "hypervisor" / "parameters" / "os_family"
                           / "Suse.yaml").read_text())["values"]["libvirt"]
    enabled = re.search(r"^systemctl enable (.+)$", profile, re.M)
    masked = re.search(r"^systemctl mask (.+)$", profile, re.M)
    assert enabled is not None and masked is not None
    assert enabled.group(1).split() == ["salt-minion.service", *suse["enabled"]]
    assert masked.group(1).split() == suse["masked"]
    assert "virtxend-ro.socket" in suse["enabled"]


def _systemd_verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_store_servers_units_are_what_systemd_accepts(tmp_path: Path) -> None:
    """Each unit file the store_vm formula writes on a Leap store server, handed to systemd's
    own checker (`systemd-analyze verify`), which also refuses a command that is not there."""
    rendered = json.loads((SNAPSHOTS / "store-vm-leap-15.6.json").read_text())
    units = {_args(call)["name"]: _args(call)["contents"]
             for call in _states(rendered, "file").values()
             if str(_args(call).get("name", "")).startswith("/etc/systemd/system/")}
    assert "/etc/systemd/system/store-pos-gateway.service" in units, sorted(units)
    for name, contents in units.items():
        unit = tmp_path / Path(name).name
        unit.write_text(contents)
        checked = _systemd_verify(unit)
        assert checked.returncode == 0 and not checked.stderr.strip(), (name, checked.stderr)
    broken = tmp_path / "store-broken.service"
    broken.write_text(contents.replace("/usr/bin/python3", "/usr/bin/no-such-python"))
    assert _systemd_verify(broken).returncode != 0
