"""The two image descriptions side by side: the first boot a VM made from leap16-jeos
(production) and from lab-debian (what the full lab boots) goes through, read from each
description (config.xml through KIWI, config.sh, the shared root/ overlay), must be the same;
leap16-jeos's repositories work on OBS and for a local kiwi-ng; and nothing under image_builds/
targets openSUSE Leap 15.6 (out of support since 2026-04-30).

A description does not hold what its distribution's packages do at first boot (their units);
``DISTROS`` and ``MINIONS`` state those facts, each with where it was read.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

import pytest
from kiwi.xml_description import XMLDescription
from kiwi.xml_state import XMLState
from lxml import etree

from lab.state import REPO_ROOT
from store_rollout import contracts
from tasks.kiwi import (
    OBS_REPOSITORIES,
    KiwiBuilder,
    KiwiDescriptionError,
    image_key,
    local_repo_args,
    validate_description,
)
from tasks.kiwi.inprocess import _kiwi_session
from tests.kiwi_helpers import (
    DEBIAN,
    LEAP,
    OVERLAY,
    PARAMS,
    PROFILE,
    copy_description,
    copy_tree_with_links,
    desc_dir,
    edit,
)

SYSTEMD_SYSTEM = "/etc/systemd/system"
IDENTITY_UNIT = "store-identity.service"
NETWORK_ONLINE = "network-online.target"
OVERLAY_MINION_D = "/etc/salt/minion.d"
"""Where the shared overlay puts the minion.d files (a description may move them)."""
IDENTITY_SCRIPT = "/usr/local/sbin/store-identity"


@dataclass(frozen=True)
class Distro:
    """What a distribution's packages do at first boot that a description relies on."""

    network: frozenset[str]
    """Units that configure the NIC (DHCP) once enabled."""
    online: frozenset[str]
    """Units ordered before network-online.target that hold it until the NIC is up."""
    ssh: str
    """The SSH daemon's unit, as ``systemctl enable`` names it in config.sh."""
    ssh_unit_makes_host_keys: bool
    """The SSH unit itself makes missing host keys at its start."""


DISTROS = {
    # openSUSE Leap 16.0: NetworkManager is the only network stack (SUSE release notes,
    # adoc/sles/version160.adoc: "NetworkManager is now the only network configuration stack");
    # NetworkManager.service applies /etc/NetworkManager/system-connections/*.nmconnection,
    # NetworkManager-wait-online.service (`nm-online -s`) is WantedBy= and
    # Before=network-online.target (NetworkManager's data/NetworkManager-wait-online.service.in);
    # sshd.service runs ExecStartPre=/usr/sbin/sshd-gen-keys-start (openSUSE's openssh package,
    # as on Leap 15; a Leap 16 build shows it).
    "zypper": Distro(network=frozenset({"NetworkManager.service"}),
                     online=frozenset({"NetworkManager-wait-online.service"}),
                     ssh="sshd.service", ssh_unit_makes_host_keys=True),
    # Debian 12: systemd-networkd.service applies /etc/systemd/network/*.network,
    # systemd-networkd-wait-online.service is WantedBy= and Before=network-online.target;
    # ssh.service makes no host keys (openssh-server's postinst makes them at package install).
    "apt": Distro(network=frozenset({"systemd-networkd.service"}),
                  online=frozenset({"systemd-networkd-wait-online.service"}),
                  ssh="ssh.service", ssh_unit_makes_host_keys=False),
}  # fmt: skip


@dataclass(frozen=True)
class Minion:
    """The Salt minion an image runs: its unit and the directory it reads its config from."""

    unit: str
    conf_dir: str
    """minion.d/, minion_id and pki/minion/ live here."""


MINIONS = {
    # the Salt Bundle (Leap 16.0 has no salt package, SUSE release notes version160.adoc): the
    # unit venv-salt-minion, the config directory /etc/venv-salt-minion with minion.d/,
    # minion_id and pki/minion/ (Uyuni's bootstrap state, susemanager-sls
    # salt/bootstrap/init.sls: salt_minion_name / salt_config_dir when it installs the Bundle)
    "venv-salt-minion": Minion("venv-salt-minion.service", "/etc/venv-salt-minion"),
    # a distribution salt-minion, or (lab-debian) Salt in /opt/salt with its own
    # salt-minion.service: Salt's default config directory
    "salt-minion": Minion("salt-minion.service", "/etc/salt"),
}


def minion_of(packages: Iterable[str]) -> Minion:
    """The Bundle when the image installs it, else a minion reading /etc/salt."""
    return MINIONS["venv-salt-minion" if "venv-salt-minion" in packages else "salt-minion"]


# --------------------------------------------------------------------------- reading a description


@dataclass
class ImageTree:
    """The files an image ends up with that its description decides: the root/ overlay, then
    config.sh's effects in order (KIWI copies root/ before it runs config.sh)."""

    files: dict[str, str] = field(default_factory=dict)
    removed: list[tuple[str, bool]] = field(default_factory=list)
    """(pattern, recursive) of every ``rm`` config.sh runs."""
    enabled: list[str] = field(default_factory=list)

    def removes(self, path: str) -> bool:
        """config.sh deletes ``path`` (whatever a package put there) and writes nothing back."""
        hit = any(fnmatch.fnmatchcase(path, pat) or (rec and path.startswith(pat.rstrip("/") + "/"))
                  for pat, rec in self.removed)  # fmt: skip
        return hit and path not in self.files

    def mv(self, sources: list[str], dest: str) -> None:
        """``mv SRC... DIR/``: every file a source pattern matches goes into DIR."""
        for pattern in sources:
            for path in [p for p in self.files if fnmatch.fnmatchcase(p, pattern)]:
                self.files[dest.rstrip("/") + "/" + PurePosixPath(path).name] = self.files.pop(path)

    def rm(self, pattern: str, recursive: bool) -> None:
        self.removed.append((pattern, recursive))
        prefix = pattern.rstrip("/") + "/"
        for path in [p for p in self.files if fnmatch.fnmatchcase(p, pattern)
                     or (recursive and p.startswith(prefix))]:  # fmt: skip
            del self.files[path]


_PROFILE_IF_RE = re.compile(r'if \[\[ "\$\{kiwi_profiles:-\}" == \*([A-Za-z0-9_]+)\* \]\]; then')
_HEREDOC_RE = re.compile(r"cat > (\S+) <<'([A-Z]+)'")


def _unit_name(word: str) -> str:
    return word if "." in word else f"{word}.service"


def read_tree(desc: Path, profiles: list[str]) -> ImageTree:
    """The overlay, then config.sh line by line: heredocs (``cat > F <<'EOF'``), ``rm``,
    ``mv SRC... DIR/``, ``: > F``, ``systemctl enable``, and
    ``if [[ "${kiwi_profiles:-}" == *P* ]]`` blocks; any other multi-line construct is refused
    rather than guessed."""
    tree = ImageTree()
    overlay = (desc / "root").resolve()
    for path in sorted(p for p in overlay.rglob("*") if p.is_file()):
        tree.files["/" + path.relative_to(overlay).as_posix()] = path.read_text(errors="replace")
    lines = (desc / "config.sh").read_text().splitlines()
    active = [True]
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        if m := _HEREDOC_RE.fullmatch(line):
            end = lines.index(m[2], i)
            if all(active):
                tree.files[m[1]] = "\n".join(lines[i:end]) + "\n"
            i = end + 1
            continue
        if m := _PROFILE_IF_RE.fullmatch(line):
            active.append(m[1] in profiles)
            continue
        if line == "fi":
            assert len(active) > 1, f"{desc}/config.sh:{i}: fi without if"
            active.pop()
            continue
        if "<<" in line or (re.match(r"(if|for|while|case)\b", line)
                            and not line.endswith(("fi", "done", "esac"))):
            raise AssertionError(f"{desc}/config.sh:{i}: the reader does not know {line!r}")
        if not all(active):
            continue
        if line.split()[0] not in ("systemctl", "rm", "mv", ":"):
            continue
        words = shlex.split(line)
        if words[:2] == ["systemctl", "enable"]:
            tree.enabled += [_unit_name(w) for w in words[2:] if not w.startswith("-")]
        elif words[0] == "rm":
            flags = "".join(w[1:] for w in words[1:] if w.startswith("-"))
            for pattern in (w for w in words[1:] if not w.startswith("-")):
                tree.rm(pattern, "r" in flags)
        elif words[0] == "mv":
            paths = [w for w in words[1:] if not w.startswith("-")]
            assert len(paths) >= 2 and paths[-1].endswith("/"), \
                f"{desc}/config.sh:{i}: the reader knows only mv SRC... DIR/: {line!r}"
            tree.mv(paths[:-1], paths[-1])
        elif words[:2] == [":", ">"] and len(words) == 3:
            tree.files[words[2]] = ""
    assert len(active) == 1, f"{desc}/config.sh: if without fi"
    return tree


def unit_sections(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit/drop-in text -> section -> key -> values (space-separated, accumulated)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(section, {}).setdefault(key.strip(), []).extend(value.split())
    return out


def unit_deps(tree: ImageTree, unit: str) -> dict[str, set[str]]:
    """``After``/``Wants``/``Requires`` of ``unit`` as the description makes them: its unit
    file and drop-ins in /etc/systemd/system, plus other units' ``Before=unit`` and (enabled)
    ``RequiredBy=``/``WantedBy=unit``."""
    deps: dict[str, set[str]] = {"After": set(), "Wants": set(), "Requires": set()}
    own = [f"{SYSTEMD_SYSTEM}/{unit}"] + sorted(
        p for p in tree.files if fnmatch.fnmatchcase(p, f"{SYSTEMD_SYSTEM}/{unit}.d/*.conf"))
    for path in own:
        if path in tree.files:
            for key, values in unit_sections(tree.files[path]).get("Unit", {}).items():
                if key in deps:
                    deps[key].update(values)
    for path, text in tree.files.items():
        p = PurePosixPath(path)
        in_drop_in = p.suffix == ".conf" and p.parent.parent == PurePosixPath(SYSTEMD_SYSTEM) \
            and p.parent.name.endswith(".d")
        other = p.parent.name.removesuffix(".d") if in_drop_in else p.name
        if (p.parent != PurePosixPath(SYSTEMD_SYSTEM) and not in_drop_in) or other == unit:
            continue
        sections = unit_sections(text)
        if unit in sections.get("Unit", {}).get("Before", []):
            deps["After"].add(other)
        if not in_drop_in and other in tree.enabled:
            install = sections.get("Install", {})
            if unit in install.get("RequiredBy", []):
                deps["Requires"].add(other)
            if unit in install.get("WantedBy", []):
                deps["Wants"].add(other)
    return deps


def unit_environment(tree: ImageTree, unit: str) -> dict[str, str]:
    """``Environment=`` of ``unit`` from its unit file in /etc/systemd/system and its drop-ins
    (later files win, as systemd applies drop-ins in name order)."""
    env: dict[str, str] = {}
    paths = [f"{SYSTEMD_SYSTEM}/{unit}"] + sorted(
        p for p in tree.files if fnmatch.fnmatchcase(p, f"{SYSTEMD_SYSTEM}/{unit}.d/*.conf"))
    for path in (p for p in paths if p in tree.files):
        for assignment in unit_sections(tree.files[path]).get("Service", {}).get("Environment", []):
            key, _, value = assignment.partition("=")
            env[key] = value
    return env


def identity_salt_dir(tree: ImageTree) -> str | None:
    """Where store-identity writes minion_id and minion.d/15-identity.conf: its unit's
    ``STORE_IDENTITY_SALT_DIR``, else the script's default."""
    env = unit_environment(tree, IDENTITY_UNIT)
    if contracts.IDENTITY_SALT_DIR_ENV in env:
        return env[contracts.IDENTITY_SALT_DIR_ENV]
    env_name = re.escape(contracts.IDENTITY_SALT_DIR_ENV)
    m = re.search(rf"^SALT_DIR=\$\{{{env_name}:-([^}}]+)\}}$", tree.files.get(IDENTITY_SCRIPT, ""),
                  re.M)
    return m[1] if m else None


def dhcp_nics(tree: ImageTree, manager: str) -> set[str]:
    """Interfaces the description configures for DHCP (IPv4) at boot."""
    nics: set[str] = set()
    for path, text in tree.files.items():
        p = PurePosixPath(path)
        if manager == "zypper" and p.parent == PurePosixPath("/etc/NetworkManager/system-connections") \
                and p.suffix == ".nmconnection":
            sections = unit_sections(text)
            conn = sections.get("connection", {})
            if conn.get("type", [""])[0] in ("ethernet", "802-3-ethernet") \
                    and conn.get("autoconnect", ["true"])[0] not in ("false", "no", "0") \
                    and sections.get("ipv4", {}).get("method", [""])[0] == "auto":
                nics.update(conn.get("interface-name", []))
        elif manager == "apt" and p.parent == PurePosixPath("/etc/systemd/network") \
                and p.suffix == ".network":
            sections = unit_sections(text)
            if sections.get("Network", {}).get("DHCP", ["no"])[0] in ("yes", "ipv4", "true"):
                nics.update(sections.get("Match", {}).get("Name", []))
    return nics


@dataclass(frozen=True)
class FirstBoot:
    """What the first boot of a VM made from a description does, in roles, not unit names."""

    nic_names: bool
    """``net.ifnames=0`` on the kernel command line: the one NIC is eth0 on every hypervisor."""
    dhcp_nics: frozenset[str]
    enabled: frozenset[str]
    """Of: network, network-online, identity, minion, ssh."""
    minion_after: frozenset[str]
    minion_pulls_in: frozenset[str]
    machine_id: str | None
    """/etc/machine-id's content in the image ("": systemd makes one at first boot)."""
    dbus_machine_id_removed: bool
    ssh_host_keys_removed: bool
    ssh_host_keys_made_at_first_boot: bool
    minion_keys_removed: bool
    minion_id_removed: bool
    minion_d_where_minion_reads: bool
    """Every minion.d file of the overlay ends up in the directory the image's minion reads."""
    identity_writes_where_minion_reads: bool
    """store-identity writes minion_id and the token grain into that same directory."""


def first_boot(desc: Path, profile: str | None) -> FirstBoot:
    with _kiwi_session(None):
        state = XMLState(XMLDescription(str(desc / "config.xml")).load(),
                         [profile] if profile else [])  # fmt: skip
    manager = state.get_package_manager()
    distro = DISTROS[manager]
    minion = minion_of(state.get_system_packages())
    tree = read_tree(desc, list(state.profiles))
    overlay_minion_d = {p.name for p in (desc / "root" / OVERLAY_MINION_D.lstrip("/")).glob("*.conf")}
    conf = minion.conf_dir

    def roles(units: Iterable[str]) -> frozenset[str]:
        found: set[str] = set()
        for unit in units:
            found |= {role for role, match in (
                ("identity", unit == IDENTITY_UNIT),
                ("minion", unit == minion.unit),
                ("ssh", unit == distro.ssh),
                ("network", unit in distro.network),
                ("network-online", unit == NETWORK_ONLINE or unit in distro.online),
            ) if match}  # fmt: skip
        return frozenset(found)

    enabled = roles(tree.enabled)
    deps = unit_deps(tree, minion.unit)
    ssh_keygen_units = [
        u for u in tree.enabled
        if (text := tree.files.get(f"{SYSTEMD_SYSTEM}/{u}")) is not None
        and "ssh-keygen -A" in text
        and distro.ssh in unit_sections(text).get("Unit", {}).get("Before", [])]  # fmt: skip
    return FirstBoot(
        nic_names="net.ifnames=0" in (state.build_type.get_kernelcmdline() or "").split(),
        dhcp_nics=frozenset(dhcp_nics(tree, manager)),
        enabled=enabled,
        minion_after=roles(deps["After"]),
        minion_pulls_in=roles(deps["Wants"] | deps["Requires"]),
        machine_id=tree.files.get("/etc/machine-id"),
        dbus_machine_id_removed=tree.removes("/var/lib/dbus/machine-id"),
        ssh_host_keys_removed=all(
            tree.removes(f"/etc/ssh/ssh_host_{kind}_key{suffix}")
            for kind in ("rsa", "ecdsa", "ed25519") for suffix in ("", ".pub"))
        and not [p for p in tree.files if p.startswith("/etc/ssh/ssh_host_")],
        ssh_host_keys_made_at_first_boot="ssh" in enabled
        and (distro.ssh_unit_makes_host_keys or bool(ssh_keygen_units)),
        minion_keys_removed=tree.removes(f"{conf}/pki/minion/minion.pem")
        and tree.removes(f"{conf}/pki/minion/minion.pub")
        and not [p for p in tree.files if p.startswith(f"{conf}/pki/")],
        minion_id_removed=tree.removes(f"{conf}/minion_id"),
        minion_d_where_minion_reads=bool(overlay_minion_d) and all(
            f"{conf}/minion.d/{name}" in tree.files for name in overlay_minion_d),
        identity_writes_where_minion_reads=identity_salt_dir(tree) == conf,
    )  # fmt: skip


EXPECTED = FirstBoot(
    nic_names=True,
    dhcp_nics=frozenset({contracts.VM_NIC}),
    enabled=frozenset({"network", "network-online", "identity", "minion", "ssh"}),
    minion_after=frozenset({"identity", "network-online"}),
    minion_pulls_in=frozenset({"identity", "network-online"}),
    machine_id="",
    dbus_machine_id_removed=True,
    ssh_host_keys_removed=True,
    ssh_host_keys_made_at_first_boot=True,
    minion_keys_removed=True,
    minion_id_removed=True,
    minion_d_where_minion_reads=True,
    identity_writes_where_minion_reads=True,
)


def _differences(found: FirstBoot, expected: FirstBoot) -> list[str]:
    want = asdict(expected)
    return [f"{key}: {value!r}, expected {want[key]!r}"
            for key, value in asdict(found).items() if value != want[key]]  # fmt: skip


# --------------------------------------------------------------------------- first-boot contract


@pytest.mark.parametrize("name", [LEAP, DEBIAN])
def test_each_description_keeps_the_first_boot_contract(name: str) -> None:
    found = first_boot(desc_dir(name), PROFILE[name])
    assert not _differences(found, EXPECTED), f"{name}:\n" + "\n".join(
        _differences(found, EXPECTED))


def test_leap16_jeos_boots_like_lab_debian() -> None:
    """The lab boots lab-debian; production boots leap16-jeos. Whatever the lab shows about the
    VM's first boot holds for production only as far as these agree."""
    leap = first_boot(desc_dir(LEAP), PROFILE[LEAP])
    debian = first_boot(desc_dir(DEBIAN), PROFILE[DEBIAN])
    assert leap == debian, "leap16-jeos vs lab-debian:\n" + "\n".join(_differences(leap, debian))


def _config_sh_fault(name: str, *edits: tuple[str, str]) -> Callable[[Path], None]:
    """A mutation that makes ``edits`` (old, new) to config.sh, named ``name``."""
    def mutate(d: Path) -> None:
        for old, new in edits:
            edit(d / "config.sh", old, new)
    mutate.__name__ = name
    return mutate


# Leap 16's own first boot: NetworkManager, the Bundle's unit and directory
LEAP16_FAULTS = [
    (_config_sh_fault("no_dhcp", ("[ipv4]\nmethod=auto", "[ipv4]\nmethod=manual")), "dhcp_nics"),
    (_config_sh_fault("networkmanager_not_enabled", (
        "enable NetworkManager.service NetworkManager-wait-online", "enable NetworkManager-wait-online")),
     "enabled"),
    (_config_sh_fault("distribution_minion_enabled", (
        "systemctl enable venv-salt-minion.service", "systemctl enable salt-minion")), "enabled"),
    (_config_sh_fault("identity_not_required", ("Requires=store-identity.service\n", "")),
     "minion_pulls_in"),
    (_config_sh_fault("minion_d_left_in_etc_salt",
                      ("mv /etc/salt/minion.d/*.conf /etc/venv-salt-minion/minion.d/\n", ""),
                      ("rm -rf /etc/salt/minion.d\n", "")), "minion_d_where_minion_reads"),
    (_config_sh_fault("identity_writes_etc_salt", (
        "Environment=STORE_IDENTITY_SALT_DIR=/etc/venv-salt-minion\n", "")),
     "identity_writes_where_minion_reads"),
]  # fmt: skip


def _no_network_online(d: Path) -> None:
    edit(d / "config.sh", "After=network-online.target store-identity.service",
         "After=store-identity.service")


def _network_online_not_wanted(d: Path) -> None:
    edit(d / "config.sh", "Wants=network-online.target\n", "")


def _dbus_machine_id_kept(d: Path) -> None:
    edit(d / "config.sh", "rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*",
         "rm -f /etc/ssh/ssh_host_*")


def _minion_id_kept(d: Path) -> None:
    edit(d / "config.sh", "rm -f /etc/venv-salt-minion/minion_id /etc/venv-salt-minion/minion.d/",
         "rm -f /etc/venv-salt-minion/minion.d/")


def _no_ifnames(d: Path) -> None:
    edit(d / "config.xml", 'console=tty0 net.ifnames=0"', 'console=tty0"')


def _host_keys_kept(d: Path) -> None:
    edit(d / "config.sh", "rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*",
         "rm -f /var/lib/dbus/machine-id")


def _host_key_written_after_the_rm(d: Path) -> None:
    with (d / "config.sh").open("a") as fh:
        fh.write("cat > /etc/ssh/ssh_host_ed25519_key <<'KEY'\nbaked\nKEY\n")


def _machine_id_kept(d: Path) -> None:
    edit(d / "config.sh", ": > /etc/machine-id\n", "")


def _minion_keys_kept(d: Path) -> None:
    edit(d / "config.sh", "rm -f /etc/venv-salt-minion/pki/minion/minion.pem "
         "/etc/venv-salt-minion/pki/minion/minion.pub\n", "")


def _identity_not_before_minion(d: Path) -> None:
    edit(d / "config.sh", "[Unit]\nBefore=venv-salt-minion.service\n", "[Unit]\n")
    edit(d / "config.sh", "After=network-online.target store-identity.service",
         "After=network-online.target")


def _debian_no_keygen_unit(d: Path) -> None:
    edit(d / "config.sh", "systemctl enable store-ssh-hostkeys.service ssh", "systemctl enable ssh")


def _debian_not_disk(d: Path) -> None:
    edit(d / "config.sh", "*Disk*", "*Tbz*")


BROKEN = [
    *((LEAP, mutate, field_name) for mutate, field_name in LEAP16_FAULTS),
    (LEAP, _no_network_online, "minion_after"),
    (LEAP, _network_online_not_wanted, "minion_pulls_in"),
    (LEAP, _no_ifnames, "nic_names"),
    (LEAP, _host_keys_kept, "ssh_host_keys_removed"),
    (LEAP, _host_key_written_after_the_rm, "ssh_host_keys_removed"),
    (LEAP, _machine_id_kept, "machine_id"),
    (LEAP, _dbus_machine_id_kept, "dbus_machine_id_removed"),
    (LEAP, _minion_id_kept, "minion_id_removed"),
    (LEAP, _minion_keys_kept, "minion_keys_removed"),
    (LEAP, _identity_not_before_minion, "minion_after"),
    (DEBIAN, _debian_no_keygen_unit, "ssh_host_keys_made_at_first_boot"),
    (DEBIAN, _debian_not_disk, "enabled"),  # the Disk-only block no longer applies
]


def test_a_planted_fault_for_every_field() -> None:
    assert {f for _, _, f in BROKEN} == set(asdict(EXPECTED))


@pytest.mark.parametrize(("name", "mutate", "field_name"),
                         [pytest.param(n, m, f, id=f"{n}-{m.__name__.strip('_')}")
                          for n, m, f in BROKEN])  # fmt: skip
def test_the_comparison_sees_a_broken_first_boot(
    name: str, mutate: Callable[[Path], None], field_name: str, tmp_path: Path
) -> None:
    desc = copy_description(name, tmp_path)
    mutate(desc)
    found = first_boot(desc, PROFILE[name])
    assert getattr(found, field_name) != getattr(EXPECTED, field_name), _differences(
        found, EXPECTED)


def test_the_reader_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    desc = copy_description(LEAP, tmp_path)
    with (desc / "config.sh").open("a") as fh:
        fh.write('for unit in sshd NetworkManager; do\n  systemctl enable "$unit"\ndone\n')
    with pytest.raises(AssertionError, match="the reader does not know 'for unit in sshd"):
        first_boot(desc, None)


def test_the_overlay_carries_no_identity() -> None:
    """Both descriptions share the overlay: nothing in it may be a machine's identity."""
    names = {p.relative_to(OVERLAY).as_posix() for p in OVERLAY.rglob("*") if p.is_file()}
    assert not [n for n in names if n.startswith(("etc/ssh/", "etc/salt/pki/", "var/lib/dbus/"))
                or n in ("etc/machine-id", "etc/salt/minion_id")]  # fmt: skip


# --------------------------------------------------------------------------- repositories

LEAP_REPOSITORIES = {
    # what a stock Leap 16.0 enables (openSUSE-repos' opensuse-leap16-repoindex.xml: repo-oss,
    # which also carries the updates) but the openh264 codecs; plus the Salt Bundle's
    "repo-oss": "https://download.opensuse.org/distribution/leap/16.0/repo/oss",
    "uyuni-client-tools": "https://download.opensuse.org/repositories/systemsmanagement:/Uyuni:/"
                          "Stable:/openSUSE_Leap_16-Uyuni-Client-Tools/openSUSE_Leap_16.0/",
}


def obs_repository_problems(config_xml: Path) -> list[str]:
    """What OBS's parser of a KIWI description refuses (obs-build Build/Kiwi.pm, kiwiparse):
    it reads every <repository>, whatever its profiles attribute, skips those whose imageonly
    is true in Perl's sense (set, not "" or "0"), and takes obsrepositories:/ or
    obs://PROJECT/REPOSITORY; any other URL must map to an OBS repository through the server's
    urlmapper, which knows only OBS's own download URLs."""
    problems = []
    for repo in etree.parse(str(config_xml)).xpath("/image/repository"):
        if repo.get("imageonly") not in (None, "", "0"):
            continue
        path = repo.find("source").get("path")
        if path != OBS_REPOSITORIES and not re.fullmatch(r"obs:/{1,3}[^/]+/[^/]+/?", path):
            problems.append(f"repo url not using obs:/ scheme: {path}")
    return problems


def test_leap16_jeos_repositories_build_on_obs() -> None:
    config_xml = desc_dir(LEAP) / "config.xml"
    assert obs_repository_problems(config_xml) == []
    with _kiwi_session(None):
        state = XMLState(XMLDescription(str(config_xml)).load(), [])
    used = [r.get_source().get_path() for r in state.get_repository_sections_used_for_build()]
    assert used == [OBS_REPOSITORIES]
    in_image = {r.get_alias(): r.get_source().get_path()
                for r in state.get_repository_sections_used_in_image()}  # fmt: skip
    assert in_image == LEAP_REPOSITORIES


def test_the_obs_rule_refuses_a_plain_url_whatever_its_profile(tmp_path: Path) -> None:
    desc = copy_description(LEAP, tmp_path)
    edit(desc / "config.xml", '<repository type="rpm-md" alias="repo-oss" imageonly="true">',
         '<repository type="rpm-md" alias="repo-oss" profiles="Local">')
    assert obs_repository_problems(desc / "config.xml") == [
        "repo url not using obs:/ scheme: https://download.opensuse.org/distribution/leap/16.0/repo/oss"]


def test_leap16_jeos_builds_locally_from_the_same_urls(tmp_path: Path) -> None:
    """A local kiwi-ng cannot resolve obsrepositories:/; KiwiBuilder drops it and adds Leap's
    repositories as build repositories (kiwi-ng runs its repository checks on that view)."""
    args = local_repo_args(desc_dir(LEAP) / "config.xml", None)
    assert args[0] == "--ignore-repos-used-for-build"
    added = args[2::2]
    assert args[1::2] == ["--add-repo"] * len(added)
    assert {a.split(",")[2]: a.split(",")[0] for a in added} == LEAP_REPOSITORIES
    assert all(a.split(",")[1] == "rpm-md" for a in added)
    cmd = KiwiBuilder(shared_cache_dir=tmp_path / "shared", kiwi_ng="kiwi-ng").command(
        tmp_path / "desc", None, tmp_path / "work", args)
    assert cmd[cmd.index("build") + 1:cmd.index("--description")] == args
    # lab-debian builds from its own URL: no option
    assert local_repo_args(desc_dir(DEBIAN) / "config.xml", PROFILE[DEBIAN]) == []


def test_an_obs_only_description_is_refused_for_a_local_build(tmp_path: Path) -> None:
    desc = copy_description(LEAP, tmp_path)
    text = (desc / "config.xml").read_text()
    (desc / "config.xml").write_text(re.sub(
        r'<repository type="rpm-md" alias="[a-z-]+" imageonly="true">.*?</repository>', "",
        text, flags=re.S))  # fmt: skip
    validate_description(desc, None)  # KIWI itself accepts it (OBS could build it)
    with pytest.raises(KiwiDescriptionError, match="has no imageonly repository"):
        local_repo_args(desc / "config.xml", None)


def test_image_key_follows_the_repositories(tmp_path: Path) -> None:
    tree = copy_tree_with_links(tmp_path)
    key = image_key(desc_dir(LEAP, tree), PARAMS)
    edit(desc_dir(LEAP, tree) / "config.xml", "leap/16.0/repo/oss", "leap/16.0/repo/osz")
    assert image_key(desc_dir(LEAP, tree), PARAMS) != key


# --------------------------------------------------------------------------- no retired Leap

RETIRED = re.compile(r"15\.6|leap[\s_/:.-]*15|leap156|opensuse15", re.I)
"""openSUSE Leap 15.6 in any spelling a description or template uses: a version, a repository
path (leap/15.6, openSUSE_Leap_15.6, Leap:15.6), an image name (leap156), a Cobbler os_version."""
IMAGE_BUILDS = REPO_ROOT / "image_builds"


def retired_mentions(top: Path) -> list[str]:
    """``path:line: text`` of every line under ``top`` that names Leap 15.6 (symlinks followed
    once: each description's root/ is the shared overlay, read where it lives)."""
    found = []
    for path in sorted(p for p in top.rglob("*") if p.is_file() and not p.is_symlink()):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if RETIRED.search(line):
                found.append(f"{path.relative_to(top.parent)}:{number}: {line.strip()}")
    return found


# one entry per directory of image_builds/ (KIWI descriptions, AutoYaST and Agama profiles)
@pytest.mark.parametrize("top", [p.name for p in sorted(IMAGE_BUILDS.iterdir())])
def test_image_builds_target_no_retired_leap(top: str) -> None:
    found = retired_mentions(IMAGE_BUILDS / top) if (IMAGE_BUILDS / top).is_dir() else \
        [m for m in retired_mentions(IMAGE_BUILDS) if m.startswith(f"image_builds/{top}:")]
    assert not found, "Leap 15.6 is out of support (2026-04-30):\n" + "\n".join(found)


def test_the_retired_leap_check_sees_every_spelling(tmp_path: Path) -> None:
    top = tmp_path / "image_builds"
    (top / "d").mkdir(parents=True)
    spellings = ["<version>15.6.0</version>", "https://x.invalid/update/leap/15.6/oss",
                 "openSUSE_Leap_15.6", "openSUSE:Leap:15.6:Update", 'name="leap156-jeos"',
                 "os_version: opensuse15.6", "openSUSE Leap 15 SP6"]
    (top / "d" / "config.xml").write_text("\n".join([*spellings, "Leap 16.0", "SLES 15 SP7"]) + "\n")
    assert [m.split(": ", 1)[1] for m in retired_mentions(top)] == spellings
