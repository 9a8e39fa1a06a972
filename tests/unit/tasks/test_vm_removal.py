"""A cancel's clean-up waits for an installed host that is slow to answer, and fails rather
than leave the half-made VM behind in silence; a decommission's host may be gone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tasks import vm_removal


class SlowHost:
    """The master's view of a host with an accepted key (or none) that misses `silent` pings."""

    def __init__(self, silent: int, key: str | None = "accepted") -> None:
        self.silent, self.key = silent, key
        self.pings = 0
        self.removed: list[str] = []

    def key_state(self, _minion: str) -> str | None:
        return self.key

    def ping(self, _minion: str, timeout: float = 5) -> bool:
        self.pings += 1
        return self.pings > self.silent

    def cmd(self, _minion: str, fun: str, arg: list[Any], kwarg: dict[str, Any]) -> dict[str, Any]:
        self.removed.append(arg[0])
        return {"domain": True, "disk_dir": True, "data_kept": None}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(master: SlowHost) -> Any:
        clock = [0.0]
        monkeypatch.setattr(vm_removal, "master_client", lambda _config: master)
        monkeypatch.setattr(vm_removal, "get_run_logger", lambda: SimpleNamespace(
            warning=lambda *_a: None))
        monkeypatch.setattr(vm_removal.time, "monotonic", lambda: clock[0])
        monkeypatch.setattr(vm_removal.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
        return master
    return use


def remove(store_id: str, **flags: bool) -> dict[str, Any]:
    import tempfile

    from store_rollout.inventory import load_inventory
    from store_rollout.settings_parts import SaltSettings
    from tests.helpers import settings_with, write_inventory

    path = write_inventory(Path(tempfile.mkdtemp()) / "inventory.yaml", [store_id],
                           "52:54:00:3d:00")
    store = load_inventory(str(path)).get(store_id)
    return vm_removal.remove_vm.fn(store, SaltSettings.of(settings_with()), "/srv/salt-images",
                                   host_may_be_gone=True, **flags)


def test_a_cancel_waits_for_a_busy_installed_host_and_removes_the_vm(host: Any) -> None:
    master = host(SlowHost(silent=3))  # one 5-s ping was all it got: the VM stayed
    result = remove("0071", silent_host_fails=True)
    assert master.removed == ["store-0071-vm"] and "host_gone" not in result


def test_a_cancel_names_a_silent_installed_host_and_leaves_the_vm(host: Any) -> None:
    master = host(SlowHost(silent=10**6))
    result = remove("0072", silent_host_fails=True)
    assert result["host_silent"] == "store-0072-hv" and "host_gone" not in result
    assert master.removed == [] and master.pings >= 2


def test_the_cancel_undoes_the_rest_then_fails_naming_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The VM key and netboot are undone and the audit says what was left; then the clean-up
    fails with one line naming the host and the command to finish it."""
    from contextlib import nullcontext

    from flows import store_rollback
    from tests.helpers import settings_with, write_inventory

    inventory = write_inventory(tmp_path / "inventory.yaml", ["0075"], "52:54:00:3e:00")
    settings = settings_with(approval_policy="never", default_time_zone="UTC",
                             default_maintenance_windows=["daily 00:00-24:00"],
                             audit_dir=str(tmp_path / "audit"))
    calls: list[str] = []
    audit: list[str] = []
    monkeypatch.setattr(store_rollback, "cancel_leaves_as_is", lambda *a: None)
    monkeypatch.setattr(store_rollback, "check_region", lambda *_: None)
    monkeypatch.setattr(store_rollback, "load_settings", lambda: settings)
    monkeypatch.setattr(store_rollback, "tags", lambda *a: nullcontext())
    monkeypatch.setattr(store_rollback, "undo_decision", lambda *a, **k: SimpleNamespace(
        record={}, go=True))
    monkeypatch.setattr(store_rollback.guard, "describe", lambda _r: "let go")
    monkeypatch.setattr(store_rollback, "record", lambda *a: audit.append(a[4]))
    monkeypatch.setattr(store_rollback, "remove_vm", lambda *a, **k: calls.append(
        "remove_vm") or {"name": "store-0075-vm", "host_silent": "store-0075-hv"})
    for name in ("remove_vm_key", "disable_hypervisor_netboot"):
        monkeypatch.setattr(store_rollback, name, lambda *a, _n=name, **k: calls.append(_n))
    with pytest.raises(vm_removal.VmLeftOnSilentHost,
                       match="store-0075-hv did not answer .* rollback 0075"):
        store_rollback.store_rollback.fn.__wrapped__("0075", str(inventory), own_store=False,
                                                     unfinished_only=True)
    assert calls == ["remove_vm", "remove_vm_key", "disable_hypervisor_netboot"]
    assert audit == ["VM left on the silent host store-0075-hv"]


def test_a_host_never_installed_or_gone_after_a_decommission_is_not_asked(host: Any) -> None:
    never = host(SlowHost(silent=0, key=None))
    assert remove("0073", silent_host_fails=True)["host_gone"] and never.pings == 0
    gone = host(SlowHost(silent=10**6))
    assert remove("0074")["host_gone"] and gone.removed == [] and gone.pings == 1
