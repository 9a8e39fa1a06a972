"""The Salt states as each platform renders them (issues 13, 46): a store host's grains (SLES 15
SP7 with Xen, SLES 16.0 with KVM; the grain store_rollout_platform its install profile writes)
render every production state of its platform, the lab's Debian grains with the lab pillar render
the lab's, for either platform.

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
from lab.state import HOST_PY36_SALT_BIN, LAB_FILE_ROOTS, REPO_ROOT, SALT_STATES_DIR, VENV_BIN
from store_rollout.contracts import (
    LIBVIRT_EVENT_TAG_PREFIX,
    LIBVIRT_EVENTS_CONF,
    LIBVIRT_EVENTS_ENGINE,
    MINION_LINK_CONF,
    STORE_PLATFORM_GRAIN,
)
from store_rollout.platforms import PLATFORM_NAMES

SNAPSHOTS = REPO_ROOT / "tests" / "snapshots"
LEAP_15_6 = {"os": "Leap", "os_family": "Suse", "osfullname": "Leap", "osrelease": "15.6",
             "osfinger": "Leap-15", "oscodename": "openSUSE Leap 15.6", "kernel": "Linux",
             "virtual": "physical"}
SLES_15_SP7 = {"os": "SUSE", "os_family": "Suse", "osfullname": "SLES", "osrelease": "15.7",
               "osfinger": "SLES-15", "oscodename": "SUSE Linux Enterprise Server 15 SP7",
               "kernel": "Linux", "virtual": "physical"}
SLES_16 = {"os": "SUSE", "os_family": "Suse", "osfullname": "SLES", "osrelease": "16.0",
           "osfinger": "SLES-16", "oscodename": "SUSE Linux Enterprise Server 16.0",
           "kernel": "Linux", "virtual": "physical"}
DEBIAN_12 = {"os": "Debian", "os_family": "Debian", "osfullname": "Debian", "osrelease": "12",
             "osfinger": "Debian-12", "oscodename": "bookworm", "kernel": "Linux",
             "virtual": "physical"}
# as the AutoYaST profile writes it for a store with static addressing (test_lab_cobbler)
BRIDGE_GRAIN = {"name": "br0", "bootproto": "static", "address": "10.42.0.10",
                "netmask": "255.255.255.0", "gateway": "10.42.0.1"}
# an Intel host's CPU (Salt's cpu_flags grain, from /proc/cpuinfo): vmx is VT-x
INTEL_CPU_FLAGS = ["fpu", "vme", "pae", "msr", "vmx", "sse4_2", "aes", "avx2"]
HYPERVISOR = {"role": "hypervisor", "store_id": "0042"}
PLATFORMS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (minion id, grains, pillar)
    "hypervisor-sles15-xen": ("store-0042-hv", {**SLES_15_SP7, **HYPERVISOR,
                                                STORE_PLATFORM_GRAIN: "sles15-xen",
                                                "store_rollout_bridge": BRIDGE_GRAIN}, {}),
    "hypervisor-sle16-kvm": ("store-0042-hv", {**SLES_16, **HYPERVISOR,
                                               STORE_PLATFORM_GRAIN: "sle16-kvm",
                                               "cpu_flags": INTEL_CPU_FLAGS,
                                               "store_rollout_bridge": BRIDGE_GRAIN}, {}),
    "store-vm-leap-15.6": ("store-0042-vm", {**LEAP_15_6, "role": "store-server",
                                             "store_id": "0042"}, {}),
    # the lab's simulated hypervisors, with the grain their install profile writes
    **{f"hypervisor-lab-debian-12-{name}": ("store-0042-hv", {
        **DEBIAN_12, **HYPERVISOR, STORE_PLATFORM_GRAIN: name, "cpu_flags": INTEL_CPU_FLAGS},
        {"hypervisor": {"os_family": "Debian"}}) for name in PLATFORM_NAMES},
}
# what the lab's master serves: its overlay (lab/salt_overlay) ahead of salt_states/
ROOTS = {name: LAB_FILE_ROOTS if "-lab-" in name else (SALT_STATES_DIR,) for name in PLATFORMS}


def show_highstate(tmp: Path, minion_id: str, grains: dict[str, Any], pillar: dict[str, Any],
                   roots: tuple[Path, ...] = (SALT_STATES_DIR,),
                   salt_bin: Path = VENV_BIN) -> subprocess.CompletedProcess[str]:
    """`salt-call --local state.show_highstate` of a minion with these grains and pillar."""
    (tmp / "pillar").mkdir(parents=True)
    (tmp / "pillar" / "top.sls").write_text("base:\n  '*':\n    - data\n")
    (tmp / "pillar" / "data.sls").write_text(yaml.safe_dump(pillar or {"none": None}))
    (tmp / "minion").write_text(yaml.safe_dump({
        "file_client": "local", "root_dir": str(tmp / "root"), "id": minion_id,
        "file_roots": {"base": [str(root) for root in roots]},
        "pillar_roots": {"base": [str(tmp / "pillar")]}, "grains": grains}))
    # custom modules first, as a highstate (autoload_dynamic_modules) syncs them on a minion
    subprocess.run([str(salt_bin / "salt-call"), "--local", "-c", str(tmp), "saltutil.sync_all"],
                   capture_output=True, text=True, timeout=120, check=True)
    return subprocess.run([str(salt_bin / "salt-call"), "--local", "-c", str(tmp),
                           "state.show_highstate", "--out", "json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def render(tmp: Path, minion_id: str, grains: dict[str, Any], pillar: dict[str, Any],
           roots: tuple[Path, ...] = (SALT_STATES_DIR,),
           salt_bin: Path = VENV_BIN) -> dict[str, Any]:
    proc = show_highstate(tmp, minion_id, grains, pillar, roots, salt_bin)
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


def _concerns(rendered: dict[str, Any]) -> set[str]:
    return {str(body["__sls__"]) for body in rendered.values()}


def test_sles15_xen_hypervisor_boots_xen_runs_modular_libvirt_and_checks_dom0(
        tmp_path: Path) -> None:
    rendered = render(tmp_path, *PLATFORMS["hypervisor-sles15-xen"])
    assert _concerns(rendered) == {"hypervisor.xen", "hypervisor.libvirt", "hypervisor.events",
                                   "hypervisor.link", "hypervisor.checks", "hypervisor.ready"}
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
    assert {k: check[k] for k in ("driver", "require_dom0", "tools", "devices", "bridge")} == {
        "driver": "Xen", "require_dom0": True, "tools": ["qemu-img", "xorriso"], "devices": [],
        "bridge": BRIDGE_GRAIN}
    assert not _states(rendered, "network")
    assert not _states(rendered, "kmod")
    assert not any("virt" in body and "keys" in body["virt"] for body in rendered.values())


def test_sle16_kvm_hypervisor_loads_kvm_runs_virtqemud_and_has_no_xen(tmp_path: Path) -> None:
    """SLE 16 has no Xen: no Xen packages, boot entry or reboot; the CPU's kvm module loaded,
    /dev/kvm there, virtqemud's sockets enabled and libvirtd masked (libvirt 11's modular
    daemons), "ready" asks for the QEMU driver and /dev/kvm, not dom0."""
    rendered = render(tmp_path, *PLATFORMS["hypervisor-sle16-kvm"])
    assert _concerns(rendered) == {"hypervisor.kvm", "hypervisor.libvirt", "hypervisor.events",
                                   "hypervisor.link", "hypervisor.checks", "hypervisor.ready"}
    assert not [sid for sid in rendered if "xen" in sid]
    assert _args(_states(rendered, "kmod")["hypervisor-kvm-init-kmod-present"])["name"] \
        == "kvm_intel"
    device = _states(rendered, "file")["hypervisor-kvm-init-file-exists"]
    assert "exists" in device and _args(device)["name"] == "/dev/kvm"
    assert _args(device)["require"] == [{"kmod": "hypervisor-kvm-init-kmod-present"}]
    services = _states(rendered, "service")
    running = {_args(c)["name"] for c in services.values() if "running" in c}
    masked = {_args(c)["name"] for c in services.values() if "masked" in c}
    assert {"virtqemud.socket", "virtqemud-ro.socket"} <= running
    assert not [unit for unit in running if "virtxend" in unit or unit.startswith("libvirtd")]
    assert {"libvirtd.service", "libvirtd.socket"} <= masked and not running & masked
    pkgs = _args(_states(rendered, "pkg")["hypervisor-libvirt-init-pkg-installed"])["pkgs"]
    assert "libvirt-daemon-qemu" in pkgs and not [p for p in pkgs if "xen" in p]
    # the events engine's connection when the minion config names none: QEMU's
    engine = yaml.safe_load(_args(_states(rendered, "file")["hypervisor-events-init-file-managed"])
                            ["contents"])["engines"][0][LIBVIRT_EVENTS_ENGINE]
    assert engine["uri"] == "qemu:///system"
    check = _args(_states(rendered, "storehost")["hypervisor-checks-init-storehost-checked"])
    assert {k: check[k] for k in ("driver", "require_dom0", "tools", "devices", "bridge")} == {
        "driver": "QEMU", "require_dom0": False, "tools": ["qemu-img", "xorriso"],
        "devices": ["/dev/kvm"], "bridge": BRIDGE_GRAIN}
    assert not _states(rendered, "network")


def test_the_kvm_module_follows_the_cpu(tmp_path: Path) -> None:
    """kvm_amd on an AMD CPU (svm); a CPU without either flag fails the render naming the
    firmware fix, before anything is changed."""
    minion_id, grains, pillar = PLATFORMS["hypervisor-sle16-kvm"]
    amd = render(tmp_path / "amd", minion_id, {**grains, "cpu_flags": ["fpu", "svm", "avx2"]},
                 pillar)
    assert _args(_states(amd, "kmod")["hypervisor-kvm-init-kmod-present"])["name"] == "kvm_amd"
    proc = show_highstate(tmp_path / "none", minion_id, {**grains, "cpu_flags": ["fpu"]}, pillar)
    assert proc.returncode != 0
    assert "neither vmx (Intel VT-x) nor svm (AMD-V)" in proc.stdout + proc.stderr
    assert "turn virtualization on in the host firmware setup" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("value", "said"), [
    (None, "grain store_rollout_platform missing: set it to one of sles15-xen or sle16-kvm"),
    ("leap15-xen", "grain store_rollout_platform is 'leap15-xen', not one of sles15-xen or "
                   "sle16-kvm"),
])
def test_a_host_without_a_known_platform_fails_the_render_naming_the_grain_and_fix(
        tmp_path: Path, value: str | None, said: str) -> None:
    """Fail closed, like the os_family check: no platform, no parameters (a Xen host's states on
    a KVM host, or the reverse, would break it)."""
    minion_id, grains, pillar = PLATFORMS["hypervisor-sles15-xen"]
    grains = {k: v for k, v in grains.items() if k != STORE_PLATFORM_GRAIN}
    if value:
        grains[STORE_PLATFORM_GRAIN] = value
    proc = show_highstate(tmp_path, minion_id, grains, pillar)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and said in output, output[-3000:]
    assert "grains.setval store_rollout_platform <platform>, pillar hypervisor:platform" in output
    assert "hypervisor-xen" not in output  # nothing rendered


def test_pillar_names_the_platform_over_the_grain(tmp_path: Path) -> None:
    """pillar hypervisor:platform wins over the grain (a lab test's, or an operator's override)."""
    minion_id, grains, _pillar = PLATFORMS["hypervisor-sles15-xen"]
    rendered = render(tmp_path, minion_id, {**grains, "cpu_flags": INTEL_CPU_FLAGS},
                      {"hypervisor": {"platform": "sle16-kvm"}})
    assert "hypervisor.kvm" in _concerns(rendered) and "hypervisor.xen" not in _concerns(rendered)


def test_the_formula_has_parameters_for_every_platform_and_no_other() -> None:
    """parameters/platform/ and defaults.yaml's `platforms` (the render's allowed values) are
    store_rollout/platforms.py's; the map reads the contract's grain."""
    parameters = SALT_STATES_DIR / "hypervisor" / "parameters"
    assert sorted(f.stem for f in (parameters / "platform").glob("*.yaml")) \
        == sorted(PLATFORM_NAMES)
    assert yaml.safe_load((parameters / "defaults.yaml").read_text())["platforms"] \
        == list(PLATFORM_NAMES)
    assert f"grains.get('{STORE_PLATFORM_GRAIN}')" in \
        (SALT_STATES_DIR / "hypervisor" / "map.jinja").read_text()


@pytest.mark.parametrize("platform", ["hypervisor-sles15-xen", "hypervisor-sle16-kvm"])
def test_a_store_hosts_oldest_salt_renders_the_same(tmp_path: Path, platform: str) -> None:
    """A store host renders the formula itself: Salt 3006.0 under Python 3.6 (the floor: SUSE's
    salt on sles15-xen; the Salt Bundle's 3.11 on sle16-kvm is newer) renders what the
    project's Salt does."""
    if not (HOST_PY36_SALT_BIN / "salt-call").exists():
        pytest.fail(f"{HOST_PY36_SALT_BIN} missing: `make setup` builds .venv-host-py36")
    newest = render(tmp_path / "newest", *PLATFORMS[platform])
    oldest = render(tmp_path / "oldest", *PLATFORMS[platform], salt_bin=HOST_PY36_SALT_BIN)
    # 3008 also records which sls included each state (`__sls_included_from__`)
    assert oldest == {sid: {k: v for k, v in body.items() if k != "__sls_included_from__"}
                      for sid, body in newest.items()}


@pytest.mark.parametrize("platform", PLATFORM_NAMES)
def test_lab_hypervisor_changes_nothing_on_the_host(tmp_path: Path, platform: str) -> None:
    """Either platform, emulated: the lab's Debian parameters win over the platform's."""
    rendered = render(tmp_path, *PLATFORMS[f"hypervisor-lab-debian-12-{platform}"],
                      LAB_FILE_ROOTS)
    modules = {m for body in rendered.values() for m in body if not m.startswith("__")}
    # events and link (their files, a restart on change), checks, ready
    assert modules == {"file", "module", "storehost", "grains", "event"}, modules
    # the files it writes are in the minion's own config dir (the lab's state dir)
    files = {_args(body)["name"] for body in _states(rendered, "file").values()}
    assert files == {f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}",
                     f"/etc/salt/minion.d/{MINION_LINK_CONF}"}, files
    check = _args(_states(rendered, "storehost")["hypervisor-checks-init-storehost-checked"])
    assert {k: check[k] for k in ("driver", "require_dom0", "tools", "devices", "bridge")} == {
        "driver": "QEMU", "require_dom0": False, "tools": ["qemu-img", "xorriso"],
        "devices": [], "bridge": None}


def test_the_formula_manages_the_engine_file_autoyast_writes(tmp_path: Path) -> None:
    """hypervisor.events manages the libvirt_events minion.d file the AutoYaST profile wrote at
    install: the same text (for sles15-xen's xen:///system), or the first highstate of every new
    host would rewrite it and restart its minion."""
    rendered = render(tmp_path, *PLATFORMS["hypervisor-sles15-xen"])
    managed = _args(_states(rendered, "file")["hypervisor-events-init-file-managed"])
    assert managed["name"] == f"/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}"
    profile = (REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml").read_text()
    written = re.search(rf"<file_path>/etc/salt/minion.d/{LIBVIRT_EVENTS_CONF}</file_path>.*?"
                        r"<!\[CDATA\[(.*?)\]\]>", profile, re.S)
    assert written is not None
    # Cobbler fills in the virt URI it got from step 2 (sles15-xen: the default, xen:///system)
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
    (parameters/platform/sles15-xen.yaml), so the first boot into Xen already has them, the
    libvirt_events engine's read-only socket included."""
    profile = (REPO_ROOT / "image_builds" / "autoyast" / "sles15-xen.xml").read_text()
    suse = yaml.safe_load((SALT_STATES_DIR / "hypervisor" / "parameters" / "platform"
                           / "sles15-xen.yaml").read_text())["values"]["libvirt"]
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
