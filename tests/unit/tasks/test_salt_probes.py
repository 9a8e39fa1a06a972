"""tasks/salt/probes.py's actions on a minion, on a fake master that records its jobs."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.salt import SaltCommandFailed
from tasks.salt.extensions import served_extension_hashes
from tasks.salt.probes import domain_with_current_extensions, sync_extensions


class RecordingMaster:
    def __init__(self, brought: dict[str, list[str]]) -> None:
        self.brought, self.jobs = brought, []  # type: list[tuple[str, dict[str, Any] | None]]

    def cmd(self, minion_id: str, fun: str, arg: Any = (), kwarg: dict[str, Any] | None = None,
            timeout: float = 60, gather_job_timeout: float | None = None) -> Any:
        self.jobs.append((fun, kwarg))
        return self.brought.get(fun, True)


@pytest.mark.parametrize(("brought", "reloaded"), [
    ({"saltutil.sync_utils": [], "saltutil.sync_modules": []}, False),
    ({"saltutil.sync_utils": ["utils.store_seed_iso"], "saltutil.sync_modules": []}, True),
    ({"saltutil.sync_utils": [], "saltutil.sync_modules": ["modules.storevirt"]}, True),
])
def test_extensions_sync_names_base_and_reloads_only_what_it_brought(
        brought: dict[str, list[str]], reloaded: bool) -> None:
    master = RecordingMaster(brought)
    synced = sync_extensions(master, "store-0001-hv")  # type: ignore[arg-type]
    assert synced == brought["saltutil.sync_utils"] + brought["saltutil.sync_modules"]
    quiet = {"saltenv": "base", "refresh": False}
    # utils before modules: storevirt reaches its helpers through __utils__
    assert master.jobs[:2] == [("saltutil.sync_utils", quiet), ("saltutil.sync_modules", quiet)]
    assert (("saltutil.refresh_modules", None) in master.jobs) is reloaded
    assert len(master.jobs) == 2 + reloaded


class ExtensionsMaster(RecordingMaster):
    """A hypervisor whose extension hashes are `minion_hashes` (or a failure), against the
    master's `served`; its domain summary is `summary` before a sync and `summary_after` after."""

    def __init__(self, minion_hashes: Any, served: dict[str, str],
                 brought: dict[str, list[str]]) -> None:
        super().__init__(brought)
        self.minion_hashes, self.served = minion_hashes, served
        self.summary: Any = {"name": "store-0001-vm", "code": "old"}
        self.brought.setdefault("storevirt.domain_summary", {"name": "store-0001-vm",  # type: ignore[arg-type]
                                                             "code": "new"})

    def extension_hashes(self) -> tuple[str, dict[str, str]]:
        return "sha256", self.served

    def cmd_multi(self, minion_id: str, calls: list[tuple[str, list[Any]]],
                  timeout: float = 60) -> dict[str, Any]:
        self.jobs.append(("+".join(fun for fun, _ in calls), None))
        assert calls == [("storevirt.extension_hashes", [["utils", "modules"], "sha256"]),
                         ("storevirt.domain_summary", ["store-0001-vm"])], calls
        return {"storevirt.extension_hashes": self.minion_hashes,
                "storevirt.domain_summary": self.summary}


SERVED = {"modules/storevirt.py": "a1", "utils/store_seed_iso.py": "b2"}
SYNCED = {"saltutil.sync_utils": [], "saltutil.sync_modules": ["modules.storevirt"]}
NOT_THERE = SaltCommandFailed("store-0001-hv", "storevirt.extension_hashes", 1,
                              "'storevirt.extension_hashes' is not available.")


def test_a_hypervisor_with_the_masters_extensions_is_not_asked_to_sync() -> None:
    master = ExtensionsMaster(dict(SERVED), SERVED, SYNCED)
    summary, synced = domain_with_current_extensions(
        master, "store-0001-hv", "store-0001-vm")  # type: ignore[arg-type]
    assert (summary, synced) == ({"name": "store-0001-vm", "code": "old"}, [])
    assert [fun for fun, _ in master.jobs] == [
        "storevirt.extension_hashes+storevirt.domain_summary"]  # one job in all


@pytest.mark.parametrize("minion_hashes", [
    {"modules/storevirt.py": "00", "utils/store_seed_iso.py": "b2"},  # a project update since
    {"modules/storevirt.py": "a1"},  # a util missing
    {**SERVED, "modules/retired.py": "c3"},  # one the master no longer has
    NOT_THERE,  # a storevirt from before the function
], ids=["changed", "missing", "extra", "unknown-function"])
def test_a_hypervisor_with_other_extensions_syncs_then_is_asked_again(minion_hashes: Any) -> None:
    master = ExtensionsMaster(minion_hashes, SERVED, SYNCED)
    summary, synced = domain_with_current_extensions(
        master, "store-0001-hv", "store-0001-vm")  # type: ignore[arg-type]
    assert synced == ["modules.storevirt"]
    assert summary == {"name": "store-0001-vm", "code": "new"}  # asked of the synced code
    assert [fun for fun, _ in master.jobs] == [
        "storevirt.extension_hashes+storevirt.domain_summary", "saltutil.sync_utils",
        "saltutil.sync_modules", "saltutil.refresh_modules", "storevirt.domain_summary"]


def test_a_failed_domain_summary_beside_equal_hashes_is_asked_again_after_a_sync() -> None:
    master = ExtensionsMaster(dict(SERVED), SERVED, SYNCED)
    master.summary = SaltCommandFailed("store-0001-hv", "storevirt.domain_summary", 1,
                                       "KeyError: 'store_domain_inspect.lookup'")
    summary, _ = domain_with_current_extensions(
        master, "store-0001-hv", "store-0001-vm")  # type: ignore[arg-type]
    assert summary == {"name": "store-0001-vm", "code": "new"}


class FakeFileserver:
    """salt.fileserver.Fileserver's file_list and file_hash over {path: digest}."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def file_list(self, load: dict[str, str]) -> list[str]:
        assert load["saltenv"] == "base"
        return sorted(p for p in self.files if p.startswith(load["prefix"]))

    def file_hash(self, load: dict[str, str]) -> dict[str, str]:
        return {"hsum": self.files[load["path"]], "hash_type": "sha256"}


def test_served_hashes_are_the_files_a_sync_copies_keyed_as_the_minion_keys_them() -> None:
    served = served_extension_hashes(FakeFileserver({
        "_modules/storevirt.py": "a1", "_modules/README.md": "no", "_modules/sub/x.pyx": "d4",
        "_utils/store_seed_iso.py": "b2", "_modulesque/y.py": "no", "_states/s.py": "no"}),
        "sha256")
    assert served == {"modules/storevirt.py": "a1", "modules/sub/x.pyx": "d4",
                      "utils/store_seed_iso.py": "b2"}
