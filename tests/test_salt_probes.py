"""tasks/salt/probes.py's actions on a minion, on a fake master that records its jobs."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.salt.probes import sync_extensions


class RecordingMaster:
    def __init__(self, brought: dict[str, list[str]]) -> None:
        self.brought, self.jobs = brought, []  # type: list[tuple[str, dict[str, Any] | None]]

    def cmd(self, minion_id: str, fun: str, arg: Any = (), kwarg: dict[str, Any] | None = None,
            timeout: float = 60) -> Any:
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
