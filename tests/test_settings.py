"""Settings from the environment: a missing or wrong value is named with where to set it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, VENV_BIN
from store_rollout.settings import SettingsError, load_settings

BASE = {"STORE_ROLLOUT_COBBLER_URL": "http://cobbler/", "STORE_ROLLOUT_COBBLER_USER": "u",
        "STORE_ROLLOUT_COBBLER_PASSWORD": "p", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/etc/salt/master",
        "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "salt", "STORE_ROLLOUT_ERP_URL": "http://erp/",
        "STORE_ROLLOUT_ERP_TOKEN": "t"}


def test_image_base_url_is_required_and_named() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(dict(BASE))
    assert "image_base_url: Field required (set STORE_ROLLOUT_IMAGE_BASE_URL" in str(err.value)


def test_image_base_url_must_be_http() -> None:
    with pytest.raises(SettingsError, match="image_base_url: .*'file:///var/cache/images' is not "
                                            "an http.s. URL"):
        load_settings({**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "file:///var/cache/images"})
    settings = load_settings({**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "https://images.example/s/",
                              "STORE_ROLLOUT_IMAGE_RATE_LIMIT": "2000000"})
    assert settings.image_base_url == "https://images.example/s"
    assert settings.image_rate_limit == 2_000_000 and settings.image_ca_bundle == ""


def test_cli_never_picks_a_lab_by_itself(tmp_path: Path) -> None:
    """A production worker installed from a checkout with a stale `.lab/lab.json` must not roll
    out against that lab: without STORE_ROLLOUT_LAB_DIR the CLI refuses, naming what is missing."""
    stale = REPO_ROOT / ".lab" / "lab.json"
    made, made_dir = not stale.exists(), not stale.parent.exists()
    if made:
        stale.parent.mkdir(exist_ok=True)
        stale.write_text(json.dumps({"cobbler_url": "http://127.0.0.1:1/",
                                     "image_base_url": "http://127.0.0.1:1"}))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STORE_ROLLOUT_", "PREFECT_"))}
    try:
        proc = subprocess.run([str(VENV_BIN / "store-rollout"), "rollout", "0001", "--inventory",
                               str(REPO_ROOT / "examples" / "inventory.yaml")],
                              env={**env, "PREFECT_HOME": str(tmp_path)}, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        if made:
            stale.unlink()
        if made_dir:
            stale.parent.rmdir()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    for field in ("cobbler_url", "salt_master_config", "erp_url", "image_base_url"):
        assert f"{field}: Field required (set STORE_ROLLOUT_{field.upper()}" in message, field
    assert "or name a running lab with STORE_ROLLOUT_LAB_DIR" in message


def lab_json(state_dir: Path, **fields: object) -> Path:
    """A lab.json with what the settings read from it (values need not answer)."""
    info = {"cobbler_url": "http://127.0.0.1:1/", "cobbler_user": "u", "cobbler_password": "p",
            "salt_master_config": "/nonexistent/master", "salt_master_address": "10.77.0.1",
            "salt_publish_port": 1, "salt_ret_port": 2, "libvirt_uri": "qemu:///x",
            "vm_images_dir": "/x", "erp_url": "http://127.0.0.1:1", "erp_token": "t",
            "power_type": "lab", "power_address": "http://127.0.0.1:1/power", "power_user": "u",
            "power_password": "p", "image_cache_dir": "/x", "image_base_url": "http://10.77.0.1:3",
            **fields}
    state_dir.mkdir(exist_ok=True)
    (state_dir / "lab.json").write_text(json.dumps(info))
    return state_dir


@pytest.mark.parametrize(("fields", "builder", "vm_type"), [
    ({}, "lab", "qemu"),  # a lab from before the full mode: simulated guests
    ({"full": False, "vm_type": "qemu"}, "lab", "qemu"),
    ({"full": True, "vm_type": "qemu"}, "kiwi", "qemu"),  # TCG
    ({"full": True, "vm_type": "kvm"}, "kiwi", "kvm"),
])
def test_full_lab_builds_the_image_and_boots_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               fields: dict[str, object], builder: str,
                                               vm_type: str) -> None:
    monkeypatch.setenv("STORE_ROLLOUT_LAB_DIR", str(lab_json(tmp_path / "lab", **fields)))
    settings = load_settings()
    assert (settings.image_builder, settings.vm_type) == (builder, vm_type)
    # the image's minion.d names the master as the store network reaches it
    assert settings.image_params == {"SALT_MASTER": "10.77.0.1", "SALT_MASTER_PORT": "2"}


def test_kvm_only_with_hardware_virtualization(tmp_path: Path) -> None:
    """A /dev/kvm without vmx/svm (nested under a hypervisor that hides them) hangs a guest's
    firmware: the full lab uses TCG there, without asking libvirt."""
    from lab.libvirt_service import vm_type

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae hypervisor\n")
    assert vm_type("qemu+unix:///system?socket=/nonexistent", cpuinfo) == "qemu"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme vmx hypervisor\n")
    import libvirt

    with pytest.raises(libvirt.libvirtError):  # with vmx, libvirt is asked (none answers here)
        vm_type("qemu+unix:///system?socket=/nonexistent", cpuinfo)
