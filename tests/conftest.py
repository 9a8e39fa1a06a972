"""Session fixtures: one real lab for the whole test run, torn down even when tests fail."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.state import REPO_ROOT, LabInfo

# under pytest-xdist every worker runs a lab of its own (its own ports, namespaces and Prefect)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_LAB_DIR = Path(str(os.environ.get("STORE_ROLLOUT_TEST_LAB_DIR", REPO_ROOT / ".lab-test"))
                    + (f"-{_WORKER}" if _WORKER else ""))


# Seconds each slow module (or test) took (2026-11-26, `make test` on a fresh clone, 2 xdist
# workers on 2 cores; --durations); only their order matters: under pytest-xdist (--dist
# loadgroup, no groups: each test is its own unit, handed to whichever worker is free) the longest
# go first, so no worker starts a minute-long test at the end while the other idles. Tests do not
# depend on each other's order or worker: each uses its own store ids, MACs and images in its
# worker's lab.
MEASURED_SECONDS = {
    "tests/test_plan_reconcile.py": 198, "tests/test_ui.py": 181, "tests/test_rollout_e2e.py": 149,
    "tests/test_faults.py::test_vm_minion_not_back_after_first_reboot_then_rerun": 116,
    "tests/test_faults.py::test_flow_process_killed_mid_step5_then_rerun": 85,
    "tests/test_slots.py": 80, "tests/test_api_workers.py": 75, "tests/test_batch.py": 71,
    "tests/test_cancel.py": 66, "tests/test_autosign_intruder.py": 50,
    "tests/test_faults.py::test_erp_timeout_then_503_twice_then_201": 60,
    "tests/test_faults.py": 45, "tests/test_security.py": 42, "tests/test_lab_lifecycle.py": 39,
    "tests/test_bench.py::test_benchmark_quick[bench_event_reaction.py]": 14,
    "tests/test_lab.py": 12, "tests/test_libvirt_events_engine.py": 11,
    "tests/test_faults.py::test_hypervisor_minion_on_auth_protocol_2_fails_step3_naming_why": 20,
}


def _measured(item: pytest.Item) -> int:
    module = item.nodeid.split("::")[0]
    return MEASURED_SECONDS.get(item.nodeid, MEASURED_SECONDS.get(module, 0))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first (a stable sort, so a module keeps its own order among equals)."""
    items.sort(key=_measured, reverse=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[object]) -> Iterator[None]:
    """The call phase's report on the item, for fixtures that keep evidence of a failure."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def lab_dir() -> Path:
    return TEST_LAB_DIR


@pytest.fixture(scope="session")
def lab(lab_dir: Path) -> Iterator[LabInfo]:
    """The lab, up for the whole session; `lab down` runs at the end whatever happened."""
    from lab.manager import Lab

    instance = Lab.at(lab_dir)
    try:
        info = instance.up()
        yield info
    finally:
        instance.down()


def _dead_services(info: LabInfo) -> list[str]:
    from lab.manager import Lab

    return [row["service"] for row in Lab.at(Path(info.state_dir)).status() if not row["alive"]]


@pytest.fixture(autouse=True)
def _lab_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around every lab test: every service alive and no fault knob set, before and after. A test
    that kills a service for good or leaves a knob set fails itself, naming what it left; the lab
    is then repaired (`up` restarts what died, the knobs are reset), so the next test on this
    worker starts clean instead of failing for a reason that looks unrelated."""
    if "lab" not in request.fixturenames:
        yield
        return
    from lab.faults import knobs_set, reset_all
    from lab.manager import Lab

    info: LabInfo = request.getfixturevalue("lab")
    lab = Lab.at(Path(info.state_dir))
    if _dead_services(info):  # a lab someone else broke (a reused dir): repaired quietly
        lab.up()
    reset_all(info)
    yield
    left: list[str] = []
    dead = _dead_services(info)
    if dead:
        left.append(f"lab services dead after the test: {', '.join(dead)} (restarted)")
        lab.up()
    knobs = knobs_set(info)
    reset_all(info)
    if knobs:
        left.append(f"fault knobs left set by the test: {knobs} (reset)")
    if left:
        pytest.fail("; ".join(left), pytrace=False)


@pytest.fixture
def faults(lab: LabInfo) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """`faults(target, knob)` sets a fault knob of the lab (`lab.faults.set_fault`); every knob of
    every service is cleared when the test ends, and a service that refuses fails the test."""
    from lab.faults import reset_all, set_fault

    yield lambda target, knob: set_fault(lab, target, knob)
    reset_all(lab)


@pytest.fixture(scope="session")
def lab_env(lab: LabInfo, lab_dir: Path) -> dict[str, str]:
    """Environment for subprocesses (CLI, flows) that should use the test lab."""
    return {**os.environ, "STORE_ROLLOUT_LAB_DIR": str(lab_dir),
            "PREFECT_API_URL": lab.prefect_api_url,
            "PREFECT_HOME": str(lab_dir / "prefect-client-home")}


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A throwaway Prefect server (SQLite in a temp dir) for fast tests that run flows or save
    Blocks; no lab. PREFECT_HOME is a temp dir too, so nothing of the user's profile is touched."""
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings(updates={PREFECT_HOME: tmp_path_factory.mktemp("prefect-home")}), \
            prefect_test_harness(server_startup_timeout=120):
        yield

