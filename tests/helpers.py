"""Shared helpers for lab tests: inventories, rollouts and checks on the real systems."""

from __future__ import annotations

import importlib.util
import json
import operator
import os
import re
import subprocess
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import pytest
import yaml
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from lab.prefect_access import api_session
from lab.state import SALT_STATES_DIR, VENV_BIN, LabInfo
from store_rollout.contracts import (
    BOOTSTRAP_FILES,
    ERP_STORE_SERVER_RUNNING,
    FIRSTBOOT_STAGE_DONE,
    FIRSTBOOT_STAGE_GRAIN,
    STEPS,
    STORE_PLATFORM_GRAIN,
)
from tasks.cobbler import CobblerClient
from tasks.salt import SaltMasterClient

T = TypeVar("T")
# the checkout the tests run from (tests/ is one level down)
REPO_ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], T], *, timeout: float, interval: float = 0.2, what: str) -> T:
    """Call `condition` every `interval` seconds until it returns something truthy, and return
    that; after `timeout` seconds an AssertionError names `what` and the last value. An
    exception from `condition` is not waited out: it propagates at once."""

    def timed_out(state: RetryCallState) -> T:
        last = state.outcome.result() if state.outcome is not None else None
        raise AssertionError(f"{what}: not within {timeout:g}s ({state.attempt_number} tries); "
                             f"last value: {last!r}")

    retrying = Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(interval),
                        retry=retry_if_result(operator.not_), retry_error_callback=timed_out)
    return retrying(condition)


class Background:
    """Actions a test starts beside its rollout (a service stopped, restarted later); an
    exception in one is kept and raised by `join`, in the test that started it, instead of dying
    with its thread while the test goes on (or the next one fails for it)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def guarded(self, action: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - any of them is the test's to report
                self.errors.append(exc)

        return run

    def later(self, seconds: float, action: Callable[[], object]) -> None:
        """`action` in a thread of its own, `seconds` from now."""
        timer = threading.Timer(seconds, self.guarded(action))
        self.threads.append(timer)
        timer.start()

    @contextmanager
    def on_step(self, step_name: str, action: Callable[[], object]) -> Iterator[None]:
        """`action` when `step_name` of a rollout run inside the block starts (once, in the
        step's thread, before the step goes on)."""
        from store_rollout import steps

        fired = threading.Event()

        def listener(_store: str, step: str, state: str, _seconds: float) -> None:
            if step == step_name and state == "running" and not fired.is_set():
                fired.set()
                self.guarded(action)()

        with steps.listening(listener):
            yield

    def join(self) -> None:
        """Wait for every action; raise the first error any of them had (the rest named in it)."""
        while self.threads:
            self.threads.pop().join()
        if self.errors:
            first, *rest = self.errors
            self.errors = []
            if rest:
                first.add_note(f"{len(rest)} more background error(s): {rest!r}")
            raise first


def cannot_run(reason: str) -> NoReturn:
    """A test whose prerequisite (root, a tool, a venv) is missing: skipped on a developer's
    machine, a failure under CI (CI=true), where a silent skip would hide lost coverage."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def wait_state(api: str, run_id: str, timeout: float) -> str:
    """The run's final state type (a flow run of the lab's Prefect API `api`)."""

    def final_state() -> str | None:
        state = str(api_session(api).get(f"{api}/flow_runs/{run_id}", timeout=5).json()["state_type"])
        return state if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    return wait_for(final_state, timeout=timeout, interval=2, what=f"flow run {run_id} to end")


def write_inventory(path: Path, ids: list[str], mac_prefix: str = "52:54:00:e2:00", *,
                    lab: LabInfo | None = None, regions: dict[str, str] | None = None,
                    own_libvirt: bool = False, link: dict[str, str] | None = None) -> Path:
    """An inventory of test stores; with `lab`, each store's host racked in it (a domain and its
    BMC): the odd ones (1st, 3rd...) behind IPMI, the even ones behind Redfish, so every test
    with two stores or more drives both protocols; and likewise the odd ones sles15-xen hosts,
    the even ones sle16-kvm (both platforms). `regions`: store id -> its region; `own_libvirt`:
    each host racked with a libvirtd of its own (lab/box_libvirt.py); `link`: store id -> its
    WAN link profile (lab/wan.py), set as it is racked."""
    stores = [{"store_id": sid, **({"region": (regions or {})[sid]} if sid in (regions or {}) else {}),
               "hypervisor": {"hostname": f"hv-{sid}.e2e.invalid", "mac": f"{mac_prefix}:{n:02x}",
                              "platform": "sles15-xen" if n % 2 else "sle16-kvm"},
               "vm": {"vcpus": 1, "memory_mib": 128, "disk_gib": 2, "network": "none"},
               "erp": {"site_code": f"E2E-{sid}"}} for n, sid in enumerate(ids, start=1)]
    path.write_text(yaml.safe_dump({"stores": stores}))
    if lab is not None:
        from lab.hardware import rack_inventory

        rack_inventory(lab, path, own_libvirt=own_libvirt)
        from lab.wan import set_store_link

        for store_id, profile in (link or {}).items():
            set_store_link(lab, store_id, profile)
    return path


def start_rollout(env: dict[str, str], store_id: str, inventory: Path,
                  *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(VENV_BIN / "store-rollout"), "rollout", store_id,
                             "--inventory", str(inventory), "--json", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def prefect_task_runs(lab: LabInfo, flow_run_name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    api = lab.prefect_api_url
    runs = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [flow_run_name]}}, "sort": "START_TIME_DESC", "limit": 1},
        timeout=10).json()
    assert runs, f"no flow run {flow_run_name}"

    store_id = flow_run_name.removeprefix("rollout-")

    def all_steps_recorded() -> list[dict[str, Any]] | None:
        tasks: list[dict[str, Any]] = api_session(api).post(f"{api}/task_runs/filter", json={
            "task_runs": {"flow_run_id": {"any_": [runs[0]["id"]]}}}, timeout=10).json()
        # each step's own task run (a replacement's extra task runs count for none of them)
        done = {t["name"] for t in tasks if t["state_type"] == "COMPLETED"}
        return tasks if {f"{step}-{store_id}" for step in STEPS} <= done else None

    # task runs are recorded from events, a few seconds late
    tasks = wait_for(all_steps_recorded, timeout=30, interval=1,
                     what=f"{len(STEPS)} completed task runs of {flow_run_name}")
    return runs[0], tasks


def run_logs(lab: LabInfo, flow_run_name: str, limit: int = 200) -> str:
    """Every flow run named `flow_run_name`: its state and its log lines, oldest first (what a
    failing lab test shows of the runs it judged)."""
    api = lab.prefect_api_url
    runs = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [flow_run_name]}}, "sort": "START_TIME_ASC"},
        timeout=10).json()
    lines = []
    for run in runs:
        lines.append(f"== {run['name']} {run['id']} {run['state_type']}: "
                     f"{(run.get('state') or {}).get('message')}")
        logs = api_session(api).post(f"{api}/logs/filter", json={
            "logs": {"flow_run_id": {"any_": [run["id"]]}}, "sort": "TIMESTAMP_ASC",
            "limit": limit}, timeout=10).json()
        lines += [f"{log['timestamp'][11:23]} {log['message'][:400]}" for log in logs]
    return "\n".join(lines) or f"no flow run {flow_run_name}"


def bmc_power(lab: LabInfo, system: str, action: str) -> None:
    """Power a racked store host `on` or `off` through its BMC emulator, over the protocol it
    was racked with (IPMI when it has a vbmc endpoint, else Redfish), with the lab's BMC login."""
    from pydantic import SecretStr

    from lab.hardware import vbmc_port
    from tasks.bmc import Bmc, IpmiBmc, RedfishBmc

    login = (lab.bmc_user, SecretStr(lab.bmc_password))
    port = vbmc_port(lab, system)
    bmc: Bmc = (IpmiBmc("127.0.0.1", *login, port=port) if port is not None
                else RedfishBmc(lab.redfish_url, *login, system_id=system))
    {"on": bmc.power_on, "off": bmc.power_off}[action]()


def power_actions(lab: LabInfo, system: str) -> dict[str, int]:
    """How often a host's BMC emulator powered it on and off, from the emulator's own log (a
    host racked behind IPMI logs in vbmcd's, by its domain's name; one behind Redfish in
    sushy-emulator's, by its domain's UUID)."""
    import libvirt

    conn = libvirt.openReadOnly(lab.libvirt_uri)
    try:
        uuid = conn.lookupByName(system).UUIDString()
    finally:
        conn.close()
    logs = Path(lab.state_dir) / "logs"
    ipmi = (logs / "vbmcd-bmcs.log").read_text()
    redfish = (logs / "redfish-bmc.log").read_text()
    return {"on": ipmi.count(f"Power on called for domain {system}\n")
            + redfish.count(f'System "{uuid}" power state set to "On"'),
            "off": ipmi.count(f"Power off called for domain {system}\n")
            + redfish.count(f'System "{uuid}" power state set to "ForceOff"')}


def notifications(lab: LabInfo, about: str) -> list[dict[str, str]]:
    """The messages the lab's chat channel got whose subject names `about` (the automations
    send {"subject", "body"} through the lab's notification block)."""
    log = Path(lab.notify_log)
    lines = log.read_text().splitlines() if log.exists() else []
    messages = [json.loads(line)["message"] for line in lines]
    return [m for m in messages if about in str(m.get("subject", ""))]


def said_at(lab: LabInfo, about: str) -> float:
    """When the lab's chat channel got the first message whose subject names `about` (epoch)."""
    for line in Path(lab.notify_log).read_text().splitlines():
        record = json.loads(line)
        if about in str(record["message"].get("subject", "")):
            return float(record["received"])
    raise AssertionError(f"no message about {about!r}")


def events(lab: LabInfo, name: str, resource_id: str) -> list[dict[str, Any]]:
    """The Prefect events `name` about resource `resource_id`, oldest first."""
    found = api_session(lab).post(f"{lab.prefect_api_url}/events/filter", json={
        "filter": {"event": {"name": [name]}, "resource": {"id": [resource_id]},
                   "order": "ASC"}, "limit": 50}, timeout=10).json()
    return list(found["events"])


def tftp_sent(lab: LabInfo, file: str) -> list[str]:
    """The addresses the store network's TFTP server (Cobbler's dnsmasq) sent `file` to (a
    path under the TFTP root), from its own log."""
    log = Path(lab.services["cobbler-dnsmasq"].log).read_text()
    return re.findall(rf"dnsmasq-tftp\[\d+\]: sent /srv/tftpboot/{re.escape(file)} to (\S+)", log)


def pxe_config_name(mac: str) -> str:
    """PXELINUX's per-MAC configuration file, as Cobbler names it."""
    return "pxelinux.cfg/01-" + mac.lower().replace(":", "-")


def created_erp_notices(lab: LabInfo, store_id: str) -> list[dict[str, Any]]:
    """The notices the lab's ERP created (201) for a store, from its own request log."""
    notices = [json.loads(line) for line in Path(lab.erp_log).read_text().splitlines()]
    return [n for n in notices if n.get("status") == 201
            and (n.get("payload") or {}).get("store_id") == store_id]


def go_live_table(lab: LabInfo, store_id: str) -> list[dict[str, str]]:
    """The rows of the store's latest go-live table artifact, as the UI shows them."""
    found = api_session(lab).post(f"{lab.prefect_api_url}/artifacts/filter", timeout=10, json={
        "artifacts": {"key": {"any_": [f"go-live-{store_id}"]}}, "sort": "CREATED_DESC",
        "limit": 1}).json()
    assert found, f"no go-live artifact for store {store_id}"
    data = found[0]["data"]
    rows: list[dict[str, str]] = json.loads(data) if isinstance(data, str) else data
    return rows


# the Salt the lab's simulated hosts of each platform run (lab/state.py PLATFORM_SALT_BIN)
PLATFORM_SALT = {"sles15-xen": "3006.", "sle16-kvm": "3008."}


def check_store(lab: LabInfo, store_id: str, result: dict[str, Any],
                booted_guest: bool = False, vms: int = 1) -> None:
    """`booted_guest`: the full lab's VM, which boots the image (its pinned Salt 3006, as a
    Leap host's; its disk seen only through Salt) instead of a simulated guest (the project's
    Salt, its minion.d a directory of the lab). `vms`: how many VMs the store has had (one ERP
    notice each; the result's is the last)."""
    vm_salt = "3006." if booted_guest else "3008."
    import libvirt

    hv, vm = f"store-{store_id}-hv", f"store-{store_id}-vm"
    # Cobbler: the system exists once, netboot off after the install
    cobbler = CobblerClient(url=lab.cobbler_url, user=lab.cobbler_user,
                            password=lab.cobbler_password)
    system = cobbler.get_system(hv)
    assert system is not None and system["netboot_enabled"] is False
    assert cobbler.find_systems(mac_address=system["interfaces"]["eth0"]["mac_address"]) == [hv]
    # Salt: both keys accepted, no token left for them
    master = SaltMasterClient(lab.salt_master_config)
    assert master.key_state(hv) == "accepted" and master.key_state(vm) == "accepted"
    assert master.token_for(hv) is None and master.token_for(vm) is None
    # the hypervisor runs its platform's Salt (the profile's grain says which): sles15-xen
    # SUSE's 3006 (built-in virt), sle16-kvm the Bundle's stand-in 3008; the VM vm_salt
    platform = master.cmd(hv, "grains.get", [STORE_PLATFORM_GRAIN])
    assert platform in PLATFORM_SALT, (hv, platform)
    assert master.cmd(hv, "grains.get", ["saltversion"]).startswith(PLATFORM_SALT[platform])
    assert master.cmd(vm, "grains.get", ["saltversion"]).startswith(vm_salt)
    # libvirt: running, on a qcow2 overlay of the cached base image
    conn = libvirt.open(lab.libvirt_uri)
    try:
        dom = conn.lookupByName(vm)
        assert dom.isActive() == 1
        live, config = dom.XMLDesc(0), dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    finally:
        conn.close()
    # marked autostart: the host's libvirt starts it after a power cut, as `virsh dominfo` says
    dominfo = subprocess.run(["virsh", "-c", lab.libvirt_uri, "dominfo", vm], check=True,
                             capture_output=True, text=True).stdout
    assert re.search(r"^Autostart:\s+enable$", dominfo, re.MULTILINE), dominfo
    # the identity seed: the VM booted from it, then it was ejected (live and persistent) and
    # deleted on the hypervisor; the domain's metadata says whose it was, never the token
    for xml in (live, config):
        cdrom = ET.fromstring(xml).find("./devices/disk[@device='cdrom']")
        # ejected: no source file (a running domain may keep a file-less <source index=..>)
        assert cdrom is not None and cdrom.find("source[@file]") is None, xml
        assert "sysinfo" not in xml and "autosign" not in xml
    summary = master.cmd(hv, "storevirt.domain_summary", [vm])
    assert summary["seed"] == {"minion_id": vm, "store_id": store_id, "state": "retired",
                               "attached": False}
    seed_iso = Path(result["vm"]["disk"]).parent / "seed.iso"
    assert not seed_iso.exists(), seed_iso
    assert result["vm"]["graphics"] == {"type": "vnc", "listen": "127.0.0.1"}  # VNC local only
    disk = result["vm"]["disk"]
    info = json.loads(subprocess.run(["qemu-img", "info", "--force-share", "--output=json", disk],
                                     check=True, capture_output=True, text=True).stdout)
    assert info["format"] == "qcow2"
    backing = info.get("full-backing-filename") or info["backing-filename"]
    assert Path(backing).name == "image.qcow2" and result["image_key"] in backing
    # an overlay, not a copy (a booted guest's writes grow it, but far from the base's size)
    limit = Path(backing).stat().st_size // 2 if booted_guest else 5 * 2**20
    assert Path(disk).stat().st_size < limit
    # the base came from the image server, verified against the cache's digest (the meta
    # storevirt.ensure_base_image writes beside it once the sha256 matched)
    cache_meta = json.loads((Path(lab.image_cache_dir) / result["image_key"] / "meta.json")
                            .read_text())
    assert json.loads((Path(backing).parent / "meta.json").read_text()) == cache_meta
    assert len(cache_meta["sha256"]) == 64 and cache_meta["size"] == Path(backing).stat().st_size
    # the VM: firstboot finished, bootstrap config gone (on its disk and as Salt sees it)
    assert master.cmd(vm, "grains.get", [FIRSTBOOT_STAGE_GRAIN]) == FIRSTBOOT_STAGE_DONE
    if booted_guest:
        minion_d = Path(master.cmd(vm, "config.get", ["conf_file"])).parent / "minion.d"
        exists = partial(master.cmd, vm, "file.file_exists")
        assert exists([str(minion_d / "00-master.conf")])
        assert not any(exists([str(minion_d / name)]) for name in BOOTSTRAP_FILES)
    else:
        minion_d = Path(lab.state_dir) / "simulator" / "minions" / vm / "etc" / "minion.d"
        assert (minion_d / "00-master.conf").exists()
        assert not any((minion_d / name).exists() for name in BOOTSTRAP_FILES)
    # the go-live gate passed: the role's service runs and answers on the store network
    assert master.cmd(vm, "service.status", ["store-pos-gateway"]) is True
    checks = go_live_table(lab, store_id)  # the last run's table
    assert len(checks) >= 5 and {row["result"] for row in checks} == {"pass"}, checks
    # ERP: exactly one notice created for each VM the store has had (besides its box's)
    created = [n for n in created_erp_notices(lab, store_id)
               if n["payload"]["status"] == ERP_STORE_SERVER_RUNNING]
    assert len(created) == vms and created[-1]["erp_id"] == result["erp_id"], created
    # Prefect: the run completed with its eight task runs
    run, tasks = prefect_task_runs(lab, f"rollout-{store_id}")
    assert run["state_type"] == "COMPLETED"
    # (and, besides them, the plan an approval showed, if the run asked for one, and a
    # replacement's retirement of the old box, its restore of the newest backup and its notice)
    besides = {f"{name}-{store_id}" for name in ("plan-for-approval", "retire-old-box",
                                                   "restore-backup", "notify-erp-replaced")}
    names = sorted(t["name"] for t in tasks if t["state_type"] == "COMPLETED"
                   and t["name"] not in besides)
    assert names == sorted(f"{step}-{store_id}" for step in STEPS), names  # what the UI lists
    assert set(result["step_seconds"]) == set(STEPS)


def result_from_systems(lab: LabInfo, store_id: str) -> dict[str, Any]:
    """What check_store needs from a rollout result, read back from what the store's run and
    the lab recorded, for runs whose flow result this process never saw (worker, batch).

    The flow's result is not persisted; its `rollout-<store>` artifact (markdown_report) is what
    Prefect keeps of it: the step durations, the VM's uuid and the image key's first 16
    characters. The full key is the one image cache entry with that prefix (check_store then
    finds it in the VM's backing file); the VM is the hypervisor's own domain summary, which
    must be the VM the run reported."""
    api = lab.prefect_api_url
    run = api_session(api).post(f"{api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": [f"rollout-{store_id}"]}}, "sort": "START_TIME_DESC",
        "limit": 1}, timeout=10).json()[0]
    arts = api_session(api).post(f"{api}/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"]]}, "key": {"any_": [f"rollout-{store_id}"]}}},
        timeout=10).json()
    assert len(arts) == 1, f"run {run['name']}: artifacts {[a['key'] for a in arts]}"
    report = parse_rollout_report(arts[0]["data"])
    keys = [p.name for p in Path(lab.image_cache_dir).iterdir()
            if p.is_dir() and re.fullmatch(r"[0-9a-f]+", p.name)
            and p.name.startswith(report["image_key_prefix"])]
    assert len(keys) == 1, f"image cache entries for {report['image_key_prefix']}: {keys}"
    master = SaltMasterClient(lab.salt_master_config)
    vm = master.cmd(f"store-{store_id}-hv", "storevirt.domain_summary", [f"store-{store_id}-vm"])
    assert vm["uuid"] == report["vm_uuid"], (vm, report)
    return {"vm": vm, "image_key": keys[0], "step_seconds": report["step_seconds"]}


def parse_rollout_report(markdown: str) -> dict[str, Any]:
    """The values store_rollout.steps.markdown_report wrote: step_seconds (steps without a
    duration are absent), image_key_prefix, vm_uuid."""
    rows = dict(re.findall(r"^\| (\w+) \| ([0-9.]+) \|$", markdown, re.MULTILINE))
    image = re.search(r"^- image: `([0-9a-f]+)`", markdown, re.MULTILINE)
    uuid = re.search(r"^- VM: `[^`]*` \(uuid `([^`]+)`\)", markdown, re.MULTILINE)
    assert image and uuid, markdown
    return {"step_seconds": {step: float(rows[step]) for step in STEPS if step in rows},
            "image_key_prefix": image.group(1), "vm_uuid": uuid.group(1)}


def load_salt_module(kind: str, name: str, salt: dict[str, Any] | None = None) -> ModuleType:
    """A fresh copy of one of the project's Salt modules (salt_states/<kind>/<name>.py), with
    `salt` as the __salt__ the loader would inject."""
    spec = importlib.util.spec_from_file_location(f"{name}_{kind}_under_test",
                                                  SALT_STATES_DIR / kind / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if salt is not None:
        module.__salt__ = salt  # type: ignore[attr-defined]
    return module


# minimal settings of a non-lab run: what tests of the settings and client factories start from
# (secrets only named: the Secret blocks `cobbler-password` and `erp-token`)
BASE_ENV = {"STORE_ROLLOUT_COBBLER_URL": "https://cobbler.invalid/cobbler_api",
            "STORE_ROLLOUT_COBBLER_USER": "u",
            "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "cobbler-password",
            "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/etc/salt/master",
            "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "salt", "STORE_ROLLOUT_ERP_URL": "https://erp.invalid/",
            "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "erp-token",
            "STORE_ROLLOUT_IMAGE_BASE_URL": "http://images.invalid",
            "STORE_ROLLOUT_HYPERVISOR_PLATFORM": "sles15-xen",
            "STORE_ROLLOUT_REGISTRATION_URL": "https://rmt.invalid"}


def settings_with(**fields: Any) -> Any:
    """Settings as a flow loads them from BASE_ENV, with `fields` set as loaded values (not
    validated again): for tests that hand a flow its settings."""
    from store_rollout.settings import load_settings

    return load_settings(BASE_ENV).model_copy(update=fields)


def spec_parts(settings: Any) -> tuple[Any, Any]:
    """The parts of `settings` a Cobbler record is written from (tasks/pxe_install.system_spec)."""
    from store_rollout.settings_parts import HostSettings, SaltSettings

    return SaltSettings.of(settings), HostSettings.of(settings)


def cli_in_process(lab_env: dict[str, str], *args: str,
                   settings: dict[str, str] | None = None) -> Any:
    """`store-rollout <args>` through the CLI's own Typer app in this process (a click Result:
    exit_code, stdout, stderr, exception), for checks of a command's answer: a `store-rollout`
    process spends about 4 s starting Python and importing Prefect before it does anything. The
    app's callback points Prefect at the server STORE_ROLLOUT_SETTINGS_FILE names, as for a user,
    once PREFECT_API_URL is unset. The installed command as a process stays covered by every
    rollout the tests start (start_rollout) and test_rollout_e2e's `status`. `settings`: more
    STORE_ROLLOUT_* variables, as a user exports them."""
    from typer.testing import CliRunner

    from app.cli import app

    return CliRunner().invoke(app, list(args), env={
        "STORE_ROLLOUT_SETTINGS_FILE": lab_env["STORE_ROLLOUT_SETTINGS_FILE"], "PREFECT_API_URL": None,
        "PREFECT_HOME": lab_env["PREFECT_HOME"], **(settings or {})})
