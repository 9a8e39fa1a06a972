"""A decommission's export of the store's data disk (tasks/data_export.py, storedata's
export_data_disk) and what rollback, recreation and decommission do to the data disk.

The host's side runs for real here (salt_states/_modules/storedata.py, GNU tar on a sparse
data.raw); the master is a stand-in that carries the calls to that module and does what cp.push
does (the archive lands in the master's cache under minions/<host>/files/<upload_path>). The
lab test (test_rollout_e2e) does it through a real master and minion; the module under the
store hosts' Python 3.6 and Salt 3006.0 is test_host_python36's."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from store_rollout import data_disk
from store_rollout.contracts import STEP_CREATE_VM, STEP_PXE_INSTALL_HYPERVISOR
from store_rollout.guard import WHAT, Action
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from tasks import data_export
from tasks.data_export import DataExportError, latest_export, push_limit, verified
from tests.helpers import load_salt_module

STORE = Store.model_validate({"store_id": "0042", "erp": {"site_code": "S42"}, "hypervisor": {
    "hostname": "hv.0042.example", "mac": "52:54:00:00:42:01"}})
HV, VM = STORE.hypervisor_minion_id, STORE.vm_name
PAYLOAD = b"the store's till journal\n" * 100


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FakeMaster:
    """The master as the export task uses it: the host's storedata module called for real,
    cp.push done as Salt's does it (into `cachedir`/minions/<id>/files/<upload_path>)."""

    def __init__(self, tmp: Path, images: Path, *, active: bool = False, answers: bool = True,
                 file_recv: bool = True, max_mb: int = 100, tamper: bool = False) -> None:
        self.opts = {"cachedir": str(tmp / "master-cache"), "file_recv": file_recv,
                     "file_recv_max_size": max_mb}
        self.active, self.answers, self.tamper = active, answers, tamper
        self.calls: list[str] = []
        from salt.exceptions import CommandExecutionError

        self.module = load_salt_module("_modules", "storedata", {
            "config.get": lambda key, default=None: str(images),
            "storevirt.domain_summary": lambda name: {"name": name, "active": self.active}})
        self.module.__opts__ = {"root_dir": "/"}  # type: ignore[attr-defined]
        self.error = CommandExecutionError

    def key_state(self, minion: str) -> str | None:
        return "accepted" if self.answers else None

    def ping(self, minion: str) -> bool:
        return self.answers

    def cmd(self, minion: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        assert minion == HV, minion
        self.calls.append(fun)
        kwarg = kwarg or {}
        if fun == "storevirt.domain_summary":
            return {"name": arg[0], "active": self.active}
        if fun == "storevirt.shutdown":
            self.active = False
            return {"was_running": True, "clean": True, "seconds": 1.0}
        if fun == "storedata.export_data_disk":
            return self.module.export_data_disk(*arg, **kwarg)
        if fun == "cp.push":
            landed = Path(self.opts["cachedir"], "minions", minion, "files", kwarg["upload_path"])
            landed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(arg[0], landed)
            if self.tamper:
                with landed.open("ab") as handle:
                    handle.write(b"x")
            if kwarg.get("remove_source"):
                os.remove(arg[0])
            return True
        raise AssertionError(f"unexpected call {fun}")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """The host's images dir with the store VM's data disk: a sparse 64 MiB data.raw, some
    bytes written into it."""
    images = tmp_path / "images"
    (images / VM).mkdir(parents=True)
    disk = images / VM / "data.raw"
    with disk.open("wb") as handle:
        handle.truncate(64 << 20)
        handle.seek(1 << 20)
        handle.write(PAYLOAD)
    return images


@pytest.fixture
def export(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The task's function (no Prefect run: logger and artifact stand-ins) against a master."""
    artifacts: list[str] = []
    monkeypatch.setattr(data_export, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(data_export, "create_markdown_artifact",
                        lambda **kw: artifacts.append(kw["markdown"]))

    def run(master: FakeMaster, keep_export: bool = True) -> dict[str, Any]:
        monkeypatch.setattr(data_export, "master_client", lambda _config: master)
        salt = SaltSettings(salt_master_config="/dev/null", salt_master_address="salt",
                            data_export_dir=str(tmp_path / "exports"))
        result: dict[str, Any] = data_export.export_data_disk.fn(STORE, salt, keep_export)
        return result

    run.artifacts = artifacts  # type: ignore[attr-defined]
    return run


def test_the_export_is_kept_out_of_the_masters_cache_checksummed_and_restores_the_disk(
        host: Path, export: Any, tmp_path: Path) -> None:
    disk = host / VM / "data.raw"
    master = FakeMaster(tmp_path, host, active=True)
    result = export(master)
    # the running store server shut down before its disk was packed, then pushed
    assert master.calls == ["storevirt.domain_summary", "storevirt.shutdown",
                            "storedata.export_data_disk", "cp.push"]
    kept = Path(result["path"])
    assert kept.parent == tmp_path / "exports" / "0042" and data_disk.is_export_name(STORE, kept.name)
    assert result["kept"] is True and result["sha256"] == sha256(kept) and result["bytes"] > 0
    assert result["data_disk"] == str(disk) and result["from_earlier_run"] is False
    assert kept.stat().st_mode & 0o077 == 0  # the store's data: this host's user only
    # nothing left in the master's cache (a deleted key's cache goes) nor on the host
    assert not any(p.is_file() for p in Path(master.opts["cachedir"]).rglob("*"))
    assert not (host / VM / "data-export.tar.gz").exists()
    # verifiable with the usual tools, beside it
    check = subprocess.run(["sha256sum", "-c", kept.name + ".sha256"], cwd=kept.parent,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and check.stdout.strip() == f"{kept.name}: OK", check
    assert verified(kept)
    # compressed, the disk's holes kept as holes, and it gives the same disk back
    assert result["bytes"] < 1 << 20
    restored = tmp_path / "restored"
    restored.mkdir()
    subprocess.run(["tar", "-xSzf", str(kept), "-C", str(restored)], check=True)
    assert sha256(restored / "data.raw") == sha256(disk)
    with tarfile.open(kept) as archive:
        assert [(m.name, m.size) for m in archive.getmembers()] == [("data.raw", 64 << 20)]
    assert result["sha256"] in export.artifacts[0] and str(kept) in export.artifacts[0]
    # a rerun whose host is gone (the first run powered it off) keeps what that run kept
    again = export(FakeMaster(tmp_path, host, answers=False))
    assert (again["path"], again["sha256"], again["from_earlier_run"]) == (
        str(kept), result["sha256"], True)


def test_a_host_gone_without_an_earlier_export_fails_naming_no_export(
        host: Path, export: Any, tmp_path: Path) -> None:
    master = FakeMaster(tmp_path, host, answers=False)
    with pytest.raises(DataExportError, match="--no-export"):
        export(master)
    assert master.calls == []


def test_an_export_whose_checksum_differs_is_not_kept(host: Path, export: Any,
                                                      tmp_path: Path) -> None:
    with pytest.raises(DataExportError, match="sha256"):
        export(FakeMaster(tmp_path, host, tamper=True))
    assert latest_export(tmp_path / "exports", STORE) is None
    assert not any((tmp_path / "exports" / "0042").iterdir())


def test_no_export_when_told_not_to_and_none_without_a_data_disk(
        host: Path, export: Any, tmp_path: Path) -> None:
    master = FakeMaster(tmp_path, host)
    assert export(master, keep_export=False) == {"kept": False, "asked": False}
    assert master.calls == []
    (host / VM / "data.raw").unlink()
    assert export(master) == {"kept": False, "asked": True, "data_disk": None}
    assert master.calls == ["storevirt.domain_summary", "storedata.export_data_disk"]


def test_a_master_that_takes_no_files_is_named_before_the_host_is_asked(
        host: Path, export: Any, tmp_path: Path) -> None:
    master = FakeMaster(tmp_path, host, file_recv=False)
    with pytest.raises(DataExportError, match="file_recv"):
        export(master)
    assert master.calls == []
    assert push_limit({"file_recv": True, "file_recv_max_size": 3}) == 3 << 20


def test_the_host_refuses_a_running_store_and_an_export_larger_than_the_master_takes(
        host: Path, tmp_path: Path) -> None:
    master = FakeMaster(tmp_path, host, active=True)
    with pytest.raises(master.error, match="runs"):
        master.module.export_data_disk(VM)
    master.active = False
    with pytest.raises(master.error, match="file_recv_max_size"):
        master.module.export_data_disk(VM, max_bytes=10)
    assert sorted(p.name for p in (host / VM).iterdir()) == ["data.raw"]
    assert master.module.export_data_disk("store-none-vm") == {"exported": False,
                                                               "data_disk": None}


def test_what_each_action_says_of_the_data_disk() -> None:
    path = data_disk.data_disk_path(STORE, "/srv/salt-images")
    assert path == "/srv/salt-images/store-0042-vm/data.raw"
    assert "its data disk is kept" in WHAT[Action.ROLLBACK]
    assert "its data disk is kept" in WHAT[Action.RECREATE_VM]
    assert "data disk is lost with it, no export" in WHAT[Action.REINSTALL_HOST]
    assert "its data disk (an export" in WHAT[Action.DECOMMISSION]
    assert data_disk.lost_with_host(HV, path) == (
        f"the store's data disk {path} on {HV} is lost with the host's disk; no export is made "
        "by a reinstall (a decommission keeps one)")
    assert "/var/exports/0042/" in data_disk.decommission_note(STORE, path, True, "/var/exports")
    assert "WITHOUT an export" in data_disk.decommission_note(STORE, path, False, "/x")


def test_rollback_keeps_the_data_disk_and_decommission_exports_it_first(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The flows' wiring: rollback removes the VM keeping its data disk; decommission asks with
    the data disk's fate, exports first, then removes the VM and its data disk."""
    from contextlib import nullcontext

    from flows import decommission, store_rollback
    from tasks import undo
    from tests.helpers import settings_with

    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0042", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0042}}]')
    settings = settings_with(approval_policy="never", default_time_zone="UTC",
                             default_maintenance_windows=["daily 00:00-24:00"],
                             audit_dir=str(tmp_path / "audit"),
                             data_export_dir=str(tmp_path / "exports"))
    calls: list[tuple[str, Any]] = []
    logged: list[str] = []
    monkeypatch.setattr(undo, "get_run_logger", lambda: SimpleNamespace(
        warning=lambda fmt, *a: logged.append(fmt % a)))
    for module in (decommission, store_rollback):
        monkeypatch.setattr(module, "check_region", lambda *_: None)
        monkeypatch.setattr(module, "load_settings", lambda: settings)
        monkeypatch.setattr(module, "store_owner", lambda *a: nullcontext())
        monkeypatch.setattr(module, "tags", lambda *a: nullcontext())
        for name in ("export_data_disk", "remove_vm", "remove_vm_key",
                     "disable_hypervisor_netboot", "power_off_hypervisor", "remove_store_keys",
                     "remove_hypervisor_record", "notify_erp_decommissioned"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda *a, _n=name, **k: calls.append(
                    (_n, k)) or {"erp_id": "E1", "replay": False})
    store_rollback.store_rollback.fn.__wrapped__("0042", str(inventory))
    assert calls[0] == ("remove_vm", {"host_may_be_gone": False, "keep_data": True,
                                      "silent_host_fails": False})
    assert "the store's data disk /srv/salt-images/store-0042-vm/data.raw on " \
           "store-0042-hv is kept" in logged[-1]
    calls.clear()
    done = decommission.store_decommission.fn.__wrapped__("0042", str(inventory),
                                                          keep_export=False)
    assert [name for name, _ in calls][:2] == ["export_data_disk", "remove_vm"]
    assert calls[1][1] == {"host_may_be_gone": True, "keep_data": False}
    assert "WITHOUT an export (--no-export)" in logged[-1]
    assert "data_export" in done


def test_the_plan_and_the_approval_say_what_becomes_of_the_data_disk() -> None:
    """A reinstall's plan (what its approval shows) says the data disk is lost with the host's
    disk, a replacement's that it stays on the old box, a recreation's that it is kept."""
    from store_rollout.approval_policy import approval_request
    from store_rollout.fleet.plan import plan_store
    from tests.unit.store_rollout.test_fleet_state import rolled_out

    path = "/srv/images/store-0042-vm/data.raw"
    facts = rolled_out()
    facts = facts.model_copy(update={"domain": {**(facts.domain or {}), "data_disk": path}})

    def step(plan: list[Any], name: str) -> list[str]:
        return next(s.details for s in plan if s.step == name)

    reinstall = plan_store(facts, reinstall_hypervisor=True)
    said = data_disk.lost_with_host("store-0042-hv", path)
    assert said in step(reinstall, STEP_PXE_INSTALL_HYPERVISOR)
    assert said in approval_request("0042", "destructive", reinstall)
    replace = step(plan_store(facts, replace_box=True), STEP_PXE_INSTALL_HYPERVISOR)
    assert data_disk.left_on_old_box("store-0042-hv", path) in replace and said not in replace
    assert data_disk.kept("store-0042-hv", path) in step(plan_store(facts, recreate_vm=True),
                                                        STEP_CREATE_VM)
