"""The go-live gate's verdict (store_rollout/go_live_report.py) and its rechecks (tasks/go_live.py)
over injected check rows; the lab's `service` provider shadows every function of Salt's own.

The checks themselves run on a store server in the lab (test_rollout_e2e, every check_store;
test_faults: a service down fails the gate) and under the store hosts' Python 3.6 and Salt
3006.0 (test_host_python36)."""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from store_rollout.contracts import GO_LIVE_FUNCTION, STORE_SERVER_CONFIG
from store_rollout.go_live_report import GoLiveReport
from store_rollout.inventory import Store
from tasks.go_live import RECHECK_SECONDS, GoLiveGate
from tests.helpers import REPO_ROOT

STORE = Store.model_validate({"store_id": "s1", "erp": {"site_code": "S1"}, "hypervisor": {
    "hostname": "hv.s1.example", "mac": "52:54:00:00:00:01"}})


def row(check: str, passed: bool, kind: str = "service") -> dict[str, Any]:
    return {"check": check, "kind": kind, "passed": passed,
            "observed": "running" if passed else "not running", "expected": "running"}


def test_a_store_goes_live_only_when_every_check_passed() -> None:
    good = GoLiveReport.from_rows("s1", "store-s1-vm", [row("a", True), row("b", True)])
    assert good.passed and good.failed == []
    bad = GoLiveReport.from_rows("s1", "store-s1-vm", [row("a", True), row("pos runs", False)])
    assert not bad.passed and [c.check for c in bad.failed] == ["pos runs"]
    assert bad.table() == [
        {"check": "a", "result": "pass", "observed": "running", "expected": "running"},
        {"check": "pos runs", "result": "FAIL", "observed": "not running",
         "expected": "running"}]
    message = bad.failure()
    assert message.startswith("store s1: go-live gate failed on store-s1-vm, the ERP was not "
                              "notified: pos runs: not running (expected running)"), message
    assert "rerun" in message and "a:" not in message


def test_no_checks_or_an_unreadable_answer_is_a_failure_that_says_so() -> None:
    empty = GoLiveReport.from_rows("s1", "store-s1-vm", [])
    assert not empty.passed and "any check: none ran" in empty.failure()
    garbage = GoLiveReport.from_rows("s1", "store-s1-vm", "'storegate.run' is not available.")
    assert not garbage.passed
    assert "unreadable answer: 'storegate.run' is not available." in garbage.failure()


class FakeMaster:
    def __init__(self, answers: list[list[dict[str, Any]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, list[Any]]] = []

    def cmd(self, minion_id: str, fun: str, arg: Any = (), kwarg: Any = None,
            timeout: float = 60, gather_job_timeout: float | None = None) -> Any:
        self.calls.append((minion_id, fun, list(arg)))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_gate_asks_again_while_a_service_is_still_starting() -> None:
    master, clock = FakeMaster([[row("pos runs", False)], [row("pos runs", True)]]), FakeClock()
    gate = GoLiveGate(master, STORE, settle_seconds=30, clock=clock, sleep=clock.sleep)
    report = gate.check()
    assert report.passed and gate.rounds == 2
    minion, fun, (config, epoch) = master.calls[0]
    assert (minion, fun, config) == ("store-s1-vm", GO_LIVE_FUNCTION, STORE_SERVER_CONFIG)
    assert isinstance(epoch, float)  # the orchestrator's clock, for the clock check


def test_the_gate_gives_up_when_the_settle_time_is_over() -> None:
    master, clock = FakeMaster([[row("pos runs", False)]]), FakeClock()
    report = GoLiveGate(master, STORE, settle_seconds=10, clock=clock, sleep=clock.sleep).check()
    assert not report.passed
    assert len(master.calls) == 1 + int(10 // RECHECK_SECONDS)
    assert clock.now - 1000.0 <= 10
    once = FakeMaster([[row("pos runs", False)]])
    GoLiveGate(once, STORE, settle_seconds=0, clock=clock, sleep=clock.sleep).check()
    assert len(once.calls) == 1


def _public_functions(module: Any) -> set[str]:
    aliases = getattr(module, "__func_alias__", {})
    return {aliases.get(name, name) for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and not inspect.isclass(value)
            and getattr(value, "__module__", module.__name__) == module.__name__}


def test_the_lab_service_provider_leaves_nothing_to_the_hosts_systemd() -> None:
    """Salt's loader fills a provider's missing functions from its own `service` module: each
    one the lab's lacked would act on the lab host's systemd (the first cut lacked `offline`,
    and Salt's service.running then changed nothing)."""
    import salt.modules.systemd_service as systemd

    path = REPO_ROOT / "lab" / "salt_overlay" / "_modules" / "lab_service.py"
    spec = importlib.util.spec_from_file_location("lab_service", path)
    assert spec is not None and spec.loader is not None
    lab_service = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab_service)
    missing = _public_functions(systemd) - _public_functions(lab_service)
    assert missing == set(), f"lab_service lacks {sorted(missing)}"
    assert lab_service.offline() is False
