"""Settings carried, not fetched (store_rollout/settings_parts.py): each process entry loads the
settings once and hands each task the part it uses, so a task depends on nothing else."""

from __future__ import annotations

import ast
from typing import Any

import pytest
from prefect import flow

from store_rollout.settings import SettingsError, load_settings
from store_rollout.settings_parts import ErpSettings, SaltSettings
from tests.helpers import BASE_ENV, REPO_ROOT
from tests.unit.store_rollout.test_step_rules import HV_KEYS, STORE, FakeMaster, domain

# an ERP URL the settings refuse: plain http off the loopback, insecure_erp_http not set
BAD_ERP = {**BASE_ENV, "STORE_ROLLOUT_ERP_URL": "http://erp.example.com/"}


def load_settings_calls(source: str) -> dict[str, int]:
    """How often each function of a module calls load_settings (module level: "<module>")."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = (child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                    and where == "<module>" else where)
            if isinstance(child, ast.Call) and getattr(
                    child.func, "id", getattr(child.func, "attr", "")) == "load_settings":
                found[name] = found.get(name, 0) + 1
            walk(child, name)

    walk(ast.parse(source), "<module>")
    return found


def calls_in(*packages: str) -> dict[str, dict[str, int]]:
    return {str(path.relative_to(REPO_ROOT)): calls
            for package in packages for path in sorted((REPO_ROOT / package).rglob("*.py"))
            if (calls := load_settings_calls(path.read_text()))}


def test_tasks_never_load_settings_and_each_entry_loads_them_once() -> None:
    assert calls_in("tasks") == {}, "a task loads settings: take its part as a parameter"
    for module, calls in calls_in("flows", "app", "bench").items():
        assert "<module>" not in calls, module
        over = {function: n for function, n in calls.items() if n > 1}
        assert not over, f"{module}: {over} load the settings more than once"
    # the flows: in the flow functions only, each flow once
    for module, calls in calls_in("flows").items():
        tree = ast.parse((REPO_ROOT / module).read_text())
        flows = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and any("flow" in ast.unparse(d) for d in node.decorator_list)}
        assert set(calls) <= flows, f"{module}: {set(calls) - flows} load settings"


def test_the_scan_finds_a_planted_load() -> None:
    planted = ("from store_rollout.settings import load_settings\n"
               "def step(store):\n    return load_settings().salt_master_config\n"
               "def twice():\n    settings.load_settings(); settings.load_settings()\n")
    assert load_settings_calls(planted) == {"step": 1, "twice": 2}
    assert load_settings_calls("x = load_settings()\n") == {"<module>": 1}


class Master(FakeMaster):
    """The step-3 task's master: the host's key accepted, its autosign token revoked once."""

    def __init__(self) -> None:
        super().__init__(dict(HV_KEYS), domain())
        self.revoked: list[str] = []

    def log_tail(self) -> Any:
        from tasks.salt.masterlog import MasterLogTail

        return MasterLogTail(None)  # a master logging elsewhere: no refusal to read

    def revoke_token(self, minion: str) -> bool:
        self.revoked.append(minion)
        return True


def test_a_bad_erp_url_does_not_fail_step_3(prefect_harness: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 3 talks to Salt only: with its Salt part it goes on while the ERP URL, which it
    never uses, is one the settings refuse (step 7's part would not load). Before the parts,
    step 3 loaded all the settings itself and failed on the ERP URL."""
    from tasks import salt_master

    with pytest.raises(SettingsError, match="erp_url"):
        load_settings(BAD_ERP)  # what the whole settings say of that URL
    salt = SaltSettings.of(load_settings(BASE_ENV))
    for name, value in BAD_ERP.items():  # the process environment of a worker so set up
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("STORE_ROLLOUT_SETTINGS_FILE", raising=False)
    master = Master()
    monkeypatch.setattr(salt_master, "master_client", lambda _config: master)

    @flow(name="step-3-only")
    def step_3() -> dict[str, Any]:
        return salt_master.wait_for_hypervisor(STORE, salt, already_ready=True)

    ready = step_3()
    assert ready["minion"] == STORE.hypervisor_minion_id
    assert master.revoked == [STORE.hypervisor_minion_id]


def test_a_part_holds_only_its_system_and_no_secret() -> None:
    settings = load_settings(BASE_ENV)
    erp = ErpSettings.of(settings)
    assert set(ErpSettings.model_fields) == {f for f in type(settings).model_fields
                                             if f.startswith("erp_") or f == "insecure_erp_http"}
    assert erp.erp_url == "https://erp.invalid/" and erp.erp_token_block == "erp-token"
    with pytest.raises(ValueError, match="frozen"):
        erp.erp_url = "https://other.invalid/"  # type: ignore[misc]
    assert not any("password" in f or f.rsplit("_", 1)[-1] == "token"
                   for part in (SaltSettings, ErpSettings) for f in part.model_fields)


def test_every_setting_a_task_reads_is_in_some_part() -> None:
    """Every part names settings that exist (a part cut from loaded settings cannot miss a
    field) and none is empty; that a task reads only its part's fields, mypy checks."""
    from store_rollout import settings_parts

    parts = [getattr(settings_parts, name) for name in settings_parts.__all__
             if name != "SettingsParts"]
    fields = {f for part in parts for f in part.model_fields}
    assert all(part.model_fields for part in parts)
    settings_fields = set(type(load_settings(BASE_ENV)).model_fields)
    assert fields <= settings_fields | {"default_calendar"}, fields - settings_fields

