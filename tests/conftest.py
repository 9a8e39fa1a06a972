"""Session fixtures: one real lab for the whole test run, torn down even when tests fail."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

# SQLAlchemy (the throwaway Prefect server's, prefect_harness) imported once here, in each
# worker's main thread before any test starts threads of its own: its first import inside a
# test failed once in a full run (a KeyError in its Cython extension's module init, after which
# every later import in that worker failed), which a concurrent first import from another thread
# would explain; imported up front there is no second first import to race
import sqlalchemy  # noqa: F401  (imported for the side effect above)

from lab.state import REPO_ROOT, LabInfo, LabPaths

# under pytest-xdist every worker runs a lab of its own (its own ports, namespaces and Prefect)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_LAB_DIR = Path(str(os.environ.get("STORE_ROLLOUT_TEST_LAB_DIR", REPO_ROOT / ".lab-test"))
                    + (f"-{_WORKER}" if _WORKER else ""))


# Under pytest-xdist (--dist loadgroup, no groups: each test is its own unit, handed to whichever
# worker is free) the longest tests go first, so no worker starts a minute-long test at the end
# while the other idles. How long each took is recorded, not kept by hand: `make test-durations`
# (STORE_ROLLOUT_RECORD_DURATIONS=1) writes setup+call+teardown seconds per test id into
# DURATIONS_FILE; a test not in it counts 0. Tests do not depend on each other's order or worker:
# each uses its own store ids and MACs (tests/structure/test_lab_tests_isolated.py) in its worker's
# lab.
DURATIONS_FILE = Path(__file__).parent / "durations.json"
RECORD_DURATIONS = os.environ.get("STORE_ROLLOUT_RECORD_DURATIONS", "") == "1"
_ran_seconds: dict[str, float] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest first (a stable sort, so a module keeps its own order among equals)."""
    recorded = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    items.sort(key=lambda item: recorded.get(item.nodeid, 0), reverse=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase's seconds (under xdist the controller sees the workers' reports too)."""
    if RECORD_DURATIONS:
        _ran_seconds[report.nodeid] = _ran_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With STORE_ROLLOUT_RECORD_DURATIONS=1: the tests that ran replace their entries (a test
    under a second is dropped, it counts 0 anyway); the others keep theirs."""
    if not RECORD_DURATIONS or hasattr(session.config, "workerinput"):  # the controller writes
        return
    recorded = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    recorded = {k: v for k, v in recorded.items() if k not in _ran_seconds}
    recorded.update({k: round(v, 2) for k, v in _ran_seconds.items() if v >= 1.0})
    DURATIONS_FILE.write_text(json.dumps(dict(sorted(recorded.items(), key=lambda kv: -kv[1])),
                                         indent=1) + "\n")


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[object]) -> Generator[None, pytest.TestReport,
                                                                          pytest.TestReport]:
    """The call phase's report on the item, for fixtures that keep evidence of a failure."""
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture(scope="session")
def lab_dir() -> Path:
    return TEST_LAB_DIR


@pytest.fixture(scope="session")
def lab(lab_dir: Path, request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabInfo]:
    """The lab, up for the whole session; at the end, whatever happened, `lab down --purge`: the
    next session starts from an empty lab, not from this one's stores, keys and domains. After a
    failure the services' logs are kept first, in pytest's temp dir (the path is printed)."""
    from lab.manager import Lab

    instance = Lab.at(lab_dir)
    try:
        info = instance.up()
        yield info
    finally:
        logs = Path(instance.paths.logs)
        # kept after a failure, or on request (STORE_ROLLOUT_KEEP_LAB_LOGS=1: to count what a
        # run did, e.g. docs/performance.md's host installs)
        if (request.session.testsfailed or os.environ.get("STORE_ROLLOUT_KEEP_LAB_LOGS")) \
                and logs.is_dir():
            kept = tmp_path_factory.getbasetemp() / f"lab-logs{'-' + _WORKER if _WORKER else ''}"
            shutil.copytree(logs, kept, dirs_exist_ok=True)
            print(f"\nlab logs of this session kept in {kept}")
        instance.down(purge=True)


def _dead_services(info: LabInfo) -> list[str]:
    from lab.manager import Lab

    return [row["service"] for row in Lab.at(Path(info.state_dir)).status() if not row["alive"]]


@pytest.fixture(autouse=True)
def _lab_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around every lab test: every service alive and no fault knob set, before and after, and
    no machine left running after it. A test that kills a service for good or leaves a knob set
    fails itself, naming what it left; the lab is then repaired (`up` restarts what died, the
    knobs are reset), so the next test on this worker starts clean instead of failing for a
    reason that looks unrelated."""
    if "lab" not in request.fixturenames:
        yield
        return
    from lab.faults import knobs_set, reset_all
    from lab.manager import Lab

    info: LabInfo = request.getfixturevalue("lab")
    services = Lab.at(Path(info.state_dir))
    if _dead_services(info):  # broken outside any test (a reused lab dir): repaired quietly
        services.up()
    if knobs_set(info):
        reset_all(info)
    yield
    # every lab test uses stores of its own: theirs are switched off, as idle machines (a
    # salt-minion each, and on a host its libvirt events engine, which every domain change of
    # the lab wakes) cost each later test on this worker CPU
    services.switch_off_machines()
    left: list[str] = []
    dead = _dead_services(info)
    if dead:
        left.append(f"lab services dead after the test: {', '.join(dead)} (restarted)")
        services.up()
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
    # the flows' settings from the file the lab writes; the lab's own tools (bench) find the lab
    from lab.prefect_access import PrefectAccess

    # the API over TLS (the lab CA) and its credential, as every client of the lab has them
    return {**os.environ, "STORE_ROLLOUT_SETTINGS_FILE": str(LabPaths(lab_dir).settings_file),
            "STORE_ROLLOUT_LAB_DIR": str(lab_dir), **PrefectAccess.of(lab).env(),
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



@pytest.fixture(scope="module")
def browser(lab: LabInfo) -> Iterator[Any]:
    """Headless Chromium (Debian's package) driven by Playwright, for tests of what the UI
    shows (tests/lab/test_ui.py's `Ui`). It trusts the lab's CA (and no other unknown one) by its
    key: Debian's Chromium takes no CA file, and the lab's state is not the user's NSS store."""
    from lab.prefect_access import PrefectAccess, spki_sha256
    from tests.lab.test_ui import CHROMIUM, CHROMIUM_ARGS, NO_TIMELINE_ARGS

    trust = [f"--ignore-certificate-errors-spki-list={spki_sha256(PrefectAccess.of(lab).ca_file)}"]

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} missing: `make setup` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    shooting = bool(os.environ.get("STORE_ROLLOUT_UI_SCREENSHOTS"))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS + trust + ([] if shooting else NO_TIMELINE_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def ui(lab: LabInfo, browser: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page on the lab's Prefect UI (a `tests.lab.test_ui.Ui`); its screenshots are kept where
    STORE_ROLLOUT_UI_SCREENSHOTS says, and printed on failure."""
    import contextlib

    from lab.prefect_access import PrefectAccess
    from tests.lab.test_ui import Ui

    shots = Path(os.environ.get("STORE_ROLLOUT_UI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        ui = Ui(page, lab.prefect_ui_url, shots)
        ui.log_in(PrefectAccess.of(lab).auth_string)
        yield ui
    finally:
        report = getattr(request.node, "rep_call", None)  # set by the report hook above
        if report is None or report.failed:
            with contextlib.suppress(Exception):  # the page may be gone
                page.screenshot(path=str(shots / "failure.png"), full_page=True)
            print(f"\nUI screenshots: {shots}")
        context.close()
