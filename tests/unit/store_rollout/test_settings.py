"""Settings from the environment: a missing or wrong value is named with where to set it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

import lab.state
from lab.state import REPO_ROOT, VENV_BIN, LabInfo, LabPaths, running_labs
from store_rollout.settings import SettingsError, load_settings

BASE = {"STORE_ROLLOUT_COBBLER_URL": "https://cobbler/", "STORE_ROLLOUT_COBBLER_USER": "u",
        "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "p", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/etc/salt/master",
        "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "salt", "STORE_ROLLOUT_ERP_URL": "https://erp/",
        "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "t"}


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


def test_power_off_time_defaults_to_cobblers_and_a_bad_one_is_named() -> None:
    base = {**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "https://images.example/s"}
    assert load_settings(base).power_off_seconds == 5.0  # as Cobbler's own reboot
    assert load_settings({**base, "STORE_ROLLOUT_POWER_OFF_SECONDS": "0"}).power_off_seconds == 0
    with pytest.raises(SettingsError, match="power_off_seconds: .*greater than or equal to 0 .*"
                                            "set STORE_ROLLOUT_POWER_OFF_SECONDS"):
        load_settings({**base, "STORE_ROLLOUT_POWER_OFF_SECONDS": "-1"})


def test_cli_never_picks_a_lab_by_itself(tmp_path: Path) -> None:
    """A production worker installed from a checkout with a stale `.lab/lab.json` must not roll
    out against that lab: without STORE_ROLLOUT_SETTINGS_FILE the CLI refuses, naming what is missing."""
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
    # issue 27 item 10: one line naming what is missing (not ~20 lines of the same advice), and
    # at most the line naming a lab that runs here (never one whose processes are gone)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: settings missing: STORE_ROLLOUT_COBBLER_URL, "), lines
    for field in ("cobbler_url", "salt_master_config", "erp_url", "image_base_url"):
        assert lines[0].count(f"STORE_ROLLOUT_{field.upper()}") == 1, field
    assert lines[0].count("STORE_ROLLOUT_SETTINGS_FILE") == 1 and "Field required" not in lines[0]
    assert lines[1:] == [] or (len(lines) == 2 and lines[1].startswith(
        "export STORE_ROLLOUT_SETTINGS_FILE=")), lines
    if made:  # the stale lab.json of this test records no live process
        assert str(stale.parent) not in re.split(r"[=\s,()]+", proc.stderr)


def test_an_image_builder_no_install_registers_is_refused() -> None:
    """kiwi is built in, the lab's builder comes with the lab's install (store_rollout/plugins.py);
    another name fails the settings, not the image step."""
    base = {**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "https://images.example/s"}
    assert load_settings(base).image_builder == "kiwi"
    assert load_settings({**base, "STORE_ROLLOUT_IMAGE_BUILDER": "lab"}).image_builder == "lab"
    with pytest.raises(SettingsError, match="image_builder: .*unknown builder 'docker'; expected "
                                            "one of kiwi, lab"):
        load_settings({**base, "STORE_ROLLOUT_IMAGE_BUILDER": "docker"})


def test_missing_settings_are_named_once_in_one_line() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({})
    brief, missing = err.value.brief, err.value.missing
    assert {"STORE_ROLLOUT_COBBLER_URL", "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK",
            "STORE_ROLLOUT_SALT_MASTER_CONFIG", "STORE_ROLLOUT_ERP_TOKEN_BLOCK",
            "STORE_ROLLOUT_IMAGE_BASE_URL"} <= set(missing)
    assert brief.startswith(f"settings missing: {', '.join(missing)} (export them")
    assert "\n" not in brief and brief.count("STORE_ROLLOUT_SETTINGS_FILE") == 1
    assert all(brief.count(name) == 1 for name in missing)
    # the message for logs keeps each field's own advice, the settings file's once
    assert "cobbler_url: Field required (set STORE_ROLLOUT_COBBLER_URL" in str(err.value)
    assert str(err.value).count("STORE_ROLLOUT_SETTINGS_FILE") == 1
    # a wrong value keeps its reason beside the missing ones
    with pytest.raises(SettingsError) as err:
        load_settings({"STORE_ROLLOUT_IMAGE_BASE_URL": "file:///var/cache/images"})
    assert "STORE_ROLLOUT_IMAGE_BASE_URL" not in err.value.missing
    assert "; image_base_url: " in err.value.brief
    assert "'file:///var/cache/images' is not an http(s) URL" in err.value.brief


def lab_state(home: Path, name: str, *processes: tuple[int, float]) -> Path:
    """A lab state dir whose lab.json records these (pid, create_time) as its services."""
    state_dir = home / name
    state_dir.mkdir()
    (state_dir / "lab.json").write_text(json.dumps({"services": {
        f"service-{i}": {"address": "-", "pid": pid, "create_time": started, "log": "-"}
        for i, (pid, started) in enumerate(processes)}}))
    return state_dir.resolve()


def test_a_lab_runs_while_a_process_it_recorded_lives(tmp_path: Path) -> None:
    me = psutil.Process()
    gone = subprocess.Popen(["true"])
    gone.wait()
    running = lab_state(tmp_path, ".lab", (gone.pid, 1.0), (me.pid, me.create_time()))
    lab_state(tmp_path, ".lab-test-gw0", (gone.pid, 1.0))  # crashed or `lab down`
    lab_state(tmp_path, ".lab-test-gw1", (me.pid, me.create_time() - 60))  # PID reused since
    lab_state(tmp_path, ".lab-test")  # nothing started yet
    (tmp_path / ".lab-old").mkdir()  # no lab.json
    (lab_state(tmp_path, ".lab-broken") / "lab.json").write_text("{not json")
    assert running_labs((tmp_path, tmp_path / ".")) == [running]


def test_cli_names_the_running_lab_and_still_refuses(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without settings, a lab running here is named as the line to paste, never used: the
    command exits 2 before touching anything."""
    from app.cli import app

    for key in [k for k in os.environ if k.startswith("STORE_ROLLOUT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(lab.state, "REPO_ROOT", tmp_path)  # where labs are looked for
    monkeypatch.chdir(tmp_path)
    me = psutil.Process()
    running = lab_state(tmp_path, ".lab", (me.pid, me.create_time()))
    argv = ["rollout", "0001", "--inventory", str(REPO_ROOT / "examples" / "inventory.yaml")]

    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: settings missing: "), lines
    assert lines[1] == (f"export STORE_ROLLOUT_SETTINGS_FILE={running / 'settings.env'}"
                        "  # the lab running on this machine")

    lab_state(tmp_path, ".lab-test", (me.pid, me.create_time()))
    lines = CliRunner().invoke(app, argv).output.splitlines()
    assert lines[1].endswith(f"(also running: {tmp_path.resolve() / '.lab-test' / 'settings.env'})")

    for state_dir in (running, tmp_path / ".lab-test"):  # its processes gone: nothing to name
        (state_dir / "lab.json").write_text(json.dumps({"services": {}}))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output


def lab_settings(state_dir: Path, **fields: object) -> Path:
    """The settings file a lab writes beside its lab.json (values need not answer)."""
    info = {"state_dir": str(state_dir), "prefect_api_url": "http://127.0.0.1:1/api",
            "prefect_ui_url": "-", "postgres_url": "-", "erp_log": "-", "simulator_url": "-",
            "cobbler_http_url": "-",
            "cobbler_url": "http://127.0.0.1:1/", "cobbler_user": "u", "cobbler_password": "p",
            "salt_master_config": "/nonexistent/master", "salt_master_address": "10.77.0.1",
            "salt_publish_port": 1, "salt_ret_port": 2, "libvirt_uri": "qemu:///x",
            "vm_images_dir": "/x", "erp_url": "http://127.0.0.1:1", "erp_token": "t",
            "bmc_user": "u", "bmc_password": "p", "image_cache_dir": "/x",
            "image_base_url": "http://10.77.0.1:3",
            **fields}
    state_dir.mkdir(exist_ok=True)
    paths = LabPaths(state_dir)
    paths.write_info(LabInfo.model_validate(info))
    return paths.settings_file


@pytest.mark.parametrize(("fields", "builder", "vm_type"), [
    ({}, "lab", "qemu"),  # a lab from before the full mode: simulated guests
    ({"full": False, "vm_type": "qemu"}, "lab", "qemu"),
    ({"full": True, "vm_type": "qemu"}, "kiwi", "qemu"),  # TCG
    ({"full": True, "vm_type": "kvm"}, "kiwi", "kvm"),
])
def test_full_lab_builds_the_image_and_boots_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               fields: dict[str, object], builder: str,
                                               vm_type: str) -> None:
    monkeypatch.setenv("STORE_ROLLOUT_SETTINGS_FILE", str(lab_settings(tmp_path / "lab", **fields)))
    settings = load_settings()
    assert (settings.image_builder, settings.vm_type) == (builder, vm_type)
    # the image's minion.d names the master as the store network reaches it
    assert settings.image_params == {"SALT_MASTER": "10.77.0.1", "SALT_MASTER_PORT": "2"}


def test_settings_file_is_read_only_when_named_and_the_environment_wins(tmp_path: Path) -> None:
    path = lab_settings(tmp_path / "lab")
    with pytest.raises(SettingsError):  # not named: nothing read from it
        load_settings({})
    settings = load_settings({"STORE_ROLLOUT_SETTINGS_FILE": str(path),
                              "STORE_ROLLOUT_ERP_URL": "https://erp.example/"})
    assert settings.erp_url == "https://erp.example/" and settings.cobbler_url == "http://127.0.0.1:1/"
    assert settings.erp_token_block == "lab-erp-token"  # the lab's secrets: Blocks it names
    with pytest.raises(SettingsError, match="STORE_ROLLOUT_SETTINGS_FILE=.*: no such file"):
        load_settings({"STORE_ROLLOUT_SETTINGS_FILE": str(tmp_path / "nowhere.env")})


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
