"""Session fixtures: one real lab for the whole test run, torn down even when tests fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.state import REPO_ROOT, LabInfo

# under pytest-xdist every worker runs a lab of its own (its own ports, namespaces and Prefect)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_LAB_DIR = Path(str(os.environ.get("STORE_ROLLOUT_TEST_LAB_DIR", REPO_ROOT / ".lab-test"))
                    + (f"-{_WORKER}" if _WORKER else ""))


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

