"""tasks/kiwi/validate.py (+ inprocess, overlay): KIWI validation of the real descriptions, and
one specific problem per broken variant of them."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.kiwi import validate_description
from tests.kiwi_helpers import (
    DEBIAN,
    LEAP,
    MINION_D,
    OVERLAY,
    PROFILE,
    copy_description,
    desc_dir,
    edit,
    no_version,
    problems_of,
)

# --------------------------------------------------------------------------- valid descriptions


def test_leap16_jeos_validates_with_kiwi() -> None:
    """KIWI's own loader (XSLT upgrade, RelaxNG, Schematron, RuntimeChecker) accepts it, and it
    is Leap 16.0 with the Salt Bundle and NetworkManager (Leap 16 has no salt package, no wicked)."""
    info = validate_description(desc_dir(LEAP), None)
    assert info.name == "leap160-jeos-store-server"
    assert info.version == "16.0.0"
    assert (info.image_type, info.format) == ("oem", "qcow2")
    assert {"venv-salt-minion", "NetworkManager", "util-linux", "dracut-kiwi-oem-repart"} <= set(
        info.packages)
    assert not {"salt-minion", "wicked"} & set(info.packages)


def test_lab_debian_validates_with_kiwi_profile_disk() -> None:
    info = validate_description(desc_dir(DEBIAN), "Disk")
    assert info.profiles == ["Disk"]
    assert (info.image_type, info.format) == ("oem", "qcow2")
    assert {"util-linux", "linux-image-amd64", "grub-pc"} <= set(info.packages)
    assert "salt-minion" not in info.packages  # not in Debian 12's archive
    xml = (desc_dir(DEBIAN) / "config.xml").read_text()
    assert 'path="http://deb.debian.org/debian"' in xml


def test_descriptions_share_one_overlay_and_scripts_are_sane() -> None:
    for name in (LEAP, DEBIAN):
        root = desc_dir(name) / "root"
        # relative, so a checkout or a copy anywhere keeps it; the lab's sits deeper (lab/...)
        assert root.is_symlink() and not os.path.isabs(os.readlink(root))
        assert root.resolve() == OVERLAY.resolve()
        config_sh = desc_dir(name) / "config.sh"
        assert config_sh.stat().st_mode & 0o777 == 0o755
        subprocess.run(["bash", "-n", str(config_sh)], check=True)
    xml = (desc_dir(LEAP) / "config.xml").read_text()
    assert 'schemaversion="8.5"' in xml and 'image="oem"' in xml and 'format="qcow2"' in xml


def test_copy_of_description_validates(tmp_path: Path) -> None:
    for name in (LEAP, DEBIAN):
        validate_description(copy_description(name, tmp_path), PROFILE[name])


def test_validation_writes_nothing_to_var_tmp(tmp_path: Path) -> None:
    before = set(os.listdir("/var/tmp"))
    validate_description(desc_dir(LEAP), None, temp_dir=tmp_path / "kt")
    assert set(os.listdir("/var/tmp")) == before


# --------------------------------------------------------------------------- broken variants


def _typo_packages(d: Path) -> None:
    edit(d / "config.xml", '<packages type="bootstrap">', '<pacakges type="bootstrap">')
    edit(d / "config.xml", "</packages>\n</image>", "</pacakges>\n</image>")


def _bad_attribute(d: Path) -> None:
    edit(d / "config.xml", 'filesystem="', 'fileystem="')


def _vmx(d: Path) -> None:
    edit(d / "config.xml", 'image="oem"', 'image="vmx"')


def _no_repository(d: Path) -> None:
    text = (d / "config.xml").read_text()
    (d / "config.xml").write_text(re.sub(r"<repository .*?</repository>", "", text, flags=re.S))


def _no_repart(d: Path) -> None:
    edit(d / "config.xml", '<package name="dracut-kiwi-oem-repart"/>', "")


def _config_sh_syntax(d: Path) -> None:
    with (d / "config.sh").open("a") as fh:
        fh.write('if [ -f /etc/os-release ]; then\n  echo "unterminated\n')


def _config_sh_not_executable(d: Path) -> None:
    (d / "config.sh").chmod(0o644)


def _overlay_yaml_broken(d: Path) -> None:
    (d / MINION_D / "10-grains.conf").write_text("grains:\n  role: [store-server\n")


def _overlay_no_sls_list(d: Path) -> None:
    edit(d / MINION_D / "90-bootstrap.conf", "sls_list:\n  - provisioning_helper.firstboot\n", "")


def _overlay_unquoted_placeholder(d: Path) -> None:
    edit(d / MINION_D / "00-master.conf", 'master: "@SALT_MASTER@"', "master: @SALT_MASTER@")


def _overlay_no_master(d: Path) -> None:
    edit(d / MINION_D / "00-master.conf", 'master: "@SALT_MASTER@"\n', "")


def _overlay_startup_elsewhere(d: Path) -> None:
    (d / MINION_D / "90-bootstrap.conf").unlink()
    (d / MINION_D / "30-startup.conf").write_text(
        "startup_states: sls\nsls_list: [provisioning_helper.firstboot]\n"
    )


def _no_util_linux(d: Path) -> None:
    edit(d / "config.xml", '<package name="util-linux"/>', "")


def _no_identity_unit(d: Path) -> None:
    (d / "root/etc/systemd/system/store-identity.service").unlink()


def _tbz_with_format(d: Path) -> None:
    edit(d / "config.xml", '<type image="tbz"/>', '<type image="tbz" format="qcow2"/>')


def _console_attr(d: Path) -> None:
    edit(d / "config.xml", 'output_console="serial" input_console="serial"', 'console="serial"')


def _zfs(d: Path) -> None:
    edit(d / "config.xml", 'filesystem="ext4"', 'filesystem="zfs"')


def _unknown_profile(d: Path) -> None:
    edit(d / "config.xml", 'import="true"', "")  # no default profile any more


BROKEN: list[tuple[str, str, Callable[[Path], None], list[str]]] = [
    # description, id, mutation, texts the problem list must contain
    (LEAP, "element-typo", _typo_packages,
     ["config.xml", "Element image has extra content: pacakges", "/image/pacakges"]),
    (LEAP, "bad-attribute", _bad_attribute,
     ["Invalid attribute fileystem for element type", "/image/preferences/type"]),
    (LEAP, "image-vmx", _vmx,
     ["format attribute is only available for the following image types: oem"]),
    (LEAP, "no-version", no_version, ["KiwiRuntimeError", "No version is defined"]),
    (LEAP, "no-repository", _no_repository, ["KiwiRuntimeError", "No repositories configured"]),
    (LEAP, "oem-resize-no-repart", _no_repart,
     ["Required dracut module package missing", "dracut-kiwi-oem-repart"]),
    (LEAP, "config-sh-syntax", _config_sh_syntax, ["config.sh: bash -n:", "unexpected"]),
    (LEAP, "config-sh-mode", _config_sh_not_executable, ["config.sh: not executable"]),
    (LEAP, "overlay-yaml", _overlay_yaml_broken, ["10-grains.conf: not valid YAML"]),
    (LEAP, "overlay-no-sls-list", _overlay_no_sls_list,
     ["minion.d: 'sls_list' must contain provisioning_helper.firstboot"]),
    (LEAP, "overlay-unquoted-placeholder", _overlay_unquoted_placeholder,
     ["00-master.conf: not valid YAML (quote placeholders"]),
    (LEAP, "overlay-startup-elsewhere", _overlay_startup_elsewhere,
     ["30-startup.conf: 'startup_states' must live in 90-bootstrap.conf"]),
    (LEAP, "no-util-linux", _no_util_linux, ["<packages type=\"image\"> lacks util-linux"]),
    (LEAP, "no-identity-unit", _no_identity_unit, ["store-identity.service: missing"]),
    (DEBIAN, "element-typo", _typo_packages, ["Element image has extra content: pacakges"]),
    (DEBIAN, "tbz-with-format", _tbz_with_format,
     ["format attribute is only available for the following image types: oem"]),
    (DEBIAN, "filesystem-zfs", _zfs, ["Invalid attribute filesystem for element type"]),
    (DEBIAN, "console-8.5", _console_attr,
     ["Element type failed to validate content", "type/bootloader"]),
    (DEBIAN, "no-version", no_version, ["No version is defined"]),
    (DEBIAN, "no-repository", _no_repository, ["No repositories configured"]),
    (DEBIAN, "config-sh-syntax", _config_sh_syntax, ["config.sh: bash -n:"]),
    (DEBIAN, "overlay-no-master", _overlay_no_master, ["no file sets 'master'"]),
    (DEBIAN, "overlay-yaml", _overlay_yaml_broken, ["10-grains.conf: not valid YAML"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "mutate", "expected"),
    [pytest.param(n, m, e, id=f"{n}-{i}") for n, i, m, e in BROKEN],
)
def test_broken_description_gives_specific_error(
    name: str, mutate: Callable[[Path], None], expected: list[str], tmp_path: Path
) -> None:
    desc = copy_description(name, tmp_path)  # an unmodified copy validates: see test_copy_...
    mutate(desc)
    text = problems_of(desc, PROFILE[name])
    for needle in expected:
        assert needle in text, f"{needle!r} not in:\n{text}"


def test_profile_needed_when_no_default(tmp_path: Path) -> None:
    desc = copy_description(DEBIAN, tmp_path)
    _unknown_profile(desc)
    text = problems_of(desc, None)
    assert "KiwiTypeNotFound" in text and "profiles declared: Tbz, Disk" in text
    validate_description(desc, "Disk")


def test_at_least_five_broken_variants_each() -> None:
    for name in (LEAP, DEBIAN):
        assert sum(1 for n, *_ in BROKEN if n == name) >= 5
