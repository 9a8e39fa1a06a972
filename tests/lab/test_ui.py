"""Issue 12: the Prefect UI in a real browser (Debian's Chromium driven by Playwright).

A store rollout is started from the deployment's "Run → Custom run" form, followed on its run page
to Completed, its eight task runs, artifacts (the report, the go-live table) and forwarded Salt
events are read off the pages; a second store is cancelled with the run page's Cancel button and
its rollback is checked on the lab's real Cobbler, libvirt and Salt. Every page visited is saved as
a PNG (docs/ui.md uses them: `make ui-screenshots`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from lab.prefect_access import api_session
from lab.state import LabInfo
from store_rollout.contracts import STEPS
from tests.helpers import created_erp_notices, run_logs, wait_for, write_inventory
from tests.lab.test_approvals_lab import check_approvals
from tests.lab.test_cancel import (
    assert_never_live,
    assert_rolled_back,
    domain_running,
    held_before_live,
)

pytestmark = pytest.mark.lab

CHROMIUM = Path(os.environ.get("STORE_ROLLOUT_CHROMIUM", "/usr/bin/chromium"))
# as root, no sandbox; no background traffic (this machine's network is closed)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# no software WebGL: a run page's timeline (a WebGL canvas no test reads) is otherwise drawn by
# the CPU 60 times a second, 1.5 cores while the page is open (docs/performance.md); the
# screenshots of docs/ui.md (`make ui-screenshots`) keep it
NO_TIMELINE_ARGS = ["--disable-software-rasterizer"]
# the UI's login field (PREFECT_SERVER_API_AUTH_STRING on: it asks for user:password)
LOGIN_PLACEHOLDER = "admin:pass"
# what the UI shows when it cannot reach the API it was configured with
CONNECTION_ERRORS = re.compile(r"Can't connect|Unable to connect|Failed to fetch|Network Error")
RUN_STATES = ("Scheduled", "Pending", "Running", "Completed", "Failed", "Crashed", "Cancelling",
              "Cancelled", "Paused")
STATE_BADGE = re.compile(rf"^({'|'.join(RUN_STATES)})$")


# the pages docs/ui.md shows, in its numbering
SHOTS = ["dashboard", "batch-run-form", "run-unknown-store", "store-run-form", "run-running",
         "run-completed", "run-task-runs", "run-artifacts", "artifact", "event-feed",
         "cancel-dialog", "run-cancelled", "rollback-run",
         # tests/lab/test_windows_lab.py, tests/lab/test_approvals_lab.py
         "scheduled-store-run", "approval-form", "approval-approved",
         "go-live-table",
         # tests/lab/test_fleet_view_ui.py
         "fleet-view"]


def field_label(name: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(name)}( \(Optional\))?$")


class Ui:
    """One browser page on the lab's Prefect UI; every page it shows is saved as a screenshot."""

    def __init__(self, page: Any, base_url: str, shots: Path) -> None:
        self.page = page
        self.base_url = base_url
        self.shots = shots
        self.taken: list[Path] = []

    def shot(self, name: str) -> Path:
        """Screenshot the page (after checking it is connected to the API), numbered as
        docs/ui.md shows it (SHOTS), whatever order the test visits the pages in."""
        self.page.wait_for_load_state("networkidle")
        body = self.page.inner_text("body")
        error = CONNECTION_ERRORS.search(body)
        number = SHOTS.index(name) + 1 if name in SHOTS else len(SHOTS) + len(self.taken) + 1
        path = self.shots / f"{number:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=False)
        self.taken.append(path)
        assert error is None, (f"the UI shows {error.group(0)!r} on {self.page.url} "
                               f"(screenshot {path}): {body[:300]}")
        return path

    def log_in(self, auth_string: str) -> None:
        """The UI's login page, as a person meets it: the server's user:password (Prefect's
        UI keeps it in the page's storage and sends it as basic auth; the API sends no
        challenge, so a browser's own HTTP credentials would never be asked for)."""
        self.goto("/")
        self.page.get_by_placeholder(LOGIN_PLACEHOLDER).fill(auth_string)
        self.page.get_by_role("button", name="Login").click()
        self.page.get_by_role("link", name="Dashboard").wait_for()

    def goto(self, path: str) -> None:
        self.page.goto(self.base_url + path)

    def field(self, name: str) -> Any:
        return self.page.get_by_label(field_label(name))

    def field_title(self, name: str) -> Any:
        """A parameter's title on the run form (lists and dicts have no single input)."""
        return self.page.get_by_text(field_label(name))

    def open_custom_run(self, deployment: str) -> None:
        """Deployments → <deployment> → Run → Custom run, as a user clicks through."""
        self.goto("/")
        self.page.get_by_role("link", name="Deployments").click()
        # the dashboard also links the flow's name (its recent runs): wait for the deployments
        # page, and click a deployment's link, or a click can land on the dashboard's flow link
        self.page.wait_for_url(re.compile(r"/deployments/?(\?.*)?$"))
        # one page shows ten deployments: search for it, as a user with more would. The UI
        # applies the search late, as a navigation to the list's URL with the search in it
        # (`navigate({to: "."})` from the list's route, Prefect 3.8's ui-v2): applied after a
        # click on the row had opened the deployment, it took the page back to the list (a full
        # run's screenshots: the list, the search filled, no Run button). So the row is clicked
        # once the URL holds the search, and again whenever the list is what shows.
        self.page.get_by_placeholder(re.compile("search", re.I)).first.fill(deployment)
        self.page.wait_for_url(re.compile(rf"flowOrDeploymentName=[^&]*{re.escape(deployment)}"))
        row = self.page.locator('a[href*="/deployments/deployment/"]').get_by_text(
            deployment, exact=True).first
        for attempt in range(5):
            if "/deployments/deployment/" not in self.page.url:
                row.click()
                with contextlib.suppress(PlaywrightTimeout):
                    self.page.wait_for_url(re.compile(r"/deployments/deployment/"), timeout=10000)
            try:
                self.page.get_by_role("button", name="Run", exact=True).click(timeout=15000)
                break
            except PlaywrightTimeout:
                self.shot(f"no-run-button-{deployment}-{attempt}")
                if attempt == 4:
                    raise AssertionError(f"no Run button for deployment {deployment} after 5 "
                                         f"tries; the page is {self.page.url}") from None
        self.page.get_by_role("menuitem", name="Custom run").click()
        self.page.get_by_text("Enforce Parameter Schema").wait_for()
        self.page.get_by_role("button", name="Submit").wait_for()

    def submit_run(self, parameters: dict[str, str]) -> str:
        """Fill the open run form, submit, follow the toast's "View run"; returns the run id."""
        for name, value in parameters.items():
            self.field(name).fill(value)
        self.page.get_by_role("button", name="Submit").click()
        self.page.get_by_role("button", name="View run").click()
        self.page.wait_for_url(re.compile(r"/runs/flow-run/[0-9a-f-]{36}"))
        match = re.search(r"/flow-run/([0-9a-f-]{36})", self.page.url)
        assert match is not None
        # the URL changes before the run page replaces the deployment page, whose run list shows
        # other runs' state badges: load the run page itself before anyone reads a badge
        self.page.goto(self.page.url)
        return match.group(1)

    def run_state(self) -> str:
        """The state badge at the top of a run page."""
        badge = self.page.locator("main").get_by_text(STATE_BADGE).first
        badge.wait_for()
        return str(badge.inner_text()).strip()

    def wait_for_state(self, wanted: set[str], timeout: float,
                       until: Any = None) -> str:
        """Read the run page's state (the UI refreshes it) until it is one of `wanted`."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.run_state()
            if state in wanted or (until is not None and until()):
                return state
            if state in ("Failed", "Crashed", "Cancelled", "Completed"):
                break  # final and not the one wanted
            self.page.wait_for_timeout(1000)
        self.shot("unexpected-state")
        pytest.fail(f"run page at {self.page.url} shows {state!r}, wanted {sorted(wanted)}")

    def park(self) -> None:
        """Leave the page while the test waits on something else: a run page redraws its
        timeline without end (by the CPU here: NO_TIMELINE_ARGS)."""
        self.page.goto("about:blank")

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name, exact=True).click()


def erp_notice_id(lab: LabInfo, store_id: str) -> str:
    """The id the lab's ERP gave the store's notice (from its own request log)."""
    created = [n["erp_id"] for n in created_erp_notices(lab, store_id)]
    assert len(created) == 1, created
    return str(created[0])


def api_get(lab: LabInfo, path: str) -> Any:
    resp = api_session(lab).get(f"{lab.prefect_api_url}{path}", timeout=10)
    resp.raise_for_status()
    return resp.json()


def test_ui_starts_follows_and_cancels_rollouts(lab: LabInfo, ui: Ui, faults: Any,
                                                tmp_path: Path) -> None:
    done_id, cancel_id = "ui-done", "ui-cancel"
    inventory = str(write_inventory(tmp_path / "inventory.yaml", [done_id, cancel_id],
                                    "52:54:00:d1:00", lab=lab))

    # the UI reaches the lab's API: the dashboard lists runs, no connection notice
    ui.goto("/")
    ui.page.get_by_role("link", name="Dashboard").wait_for()
    ui.shot("dashboard")
    settings = api_session(lab).get(f"{lab.prefect_ui_url}/ui-settings", timeout=10).json()
    assert settings["api_url"] == lab.prefect_api_url and settings["auth"] == "BASIC"

    # the batch deployment's form takes the wave parameters
    ui.open_custom_run("batch-rollout")
    for name in ("inventory", "store_ids", "canary", "wave_size", "max_in_flight",
                 "halt_failure_ratio"):
        ui.field_title(name).wait_for()  # each wave parameter is a field of the form
    ui.shot("batch-run-form")

    # a store that is not in the inventory: the run fails at once and says why on its page
    ui.open_custom_run("store-rollout")
    ui.page.get_by_text("The store to roll out").wait_for()  # the field's description
    bad_run = ui.submit_run({"store_id": "no-such-store", "inventory": inventory})
    assert ui.wait_for_state({"Failed"}, 120) == "Failed"
    ui.tab("Details")  # its State Message
    ui.page.get_by_text(f"store_id 'no-such-store' is not in the inventory {inventory}",
                        exact=False).first.wait_for()
    message = api_get(lab, f"/flow_runs/{bad_run}")["state"]["message"]
    assert "no-such-store" in message and inventory in message, message
    ui.shot("run-unknown-store")

    # start a rollout from the form and follow it on its run page until it runs
    ui.open_custom_run("store-rollout")
    ui.field("store_id").fill(done_id)
    ui.field("inventory").fill(inventory)
    ui.shot("store-run-form")
    run_id = ui.submit_run({})
    assert ui.wait_for_state({"Running"}, 120) == "Running"
    ui.shot("run-running")
    run_page = ui.page.url

    # meanwhile a second store, cancelled from its run page once its VM exists: rolled back
    # (started while the first one runs, as two people would: its steps up to the VM and the
    # first store's rollout share the wait); held in step 6, so it is not live when the cancel
    # lands
    held_before_live(faults, cancel_id)
    ui.open_custom_run("store-rollout")
    cancel_run = ui.submit_run({"store_id": cancel_id, "inventory": inventory})
    vm = f"store-{cancel_id}-vm"
    ui.wait_for_state({"Running"}, 120)

    def vm_started() -> bool:  # by this run (a lab may keep an old definition)
        assert ui.run_state() == "Running", ui.shot("cancel-run-not-running")
        return domain_running(lab, vm)

    wait_for(vm_started, timeout=300, interval=1, what=f"{vm} started by the run")
    ui.page.get_by_role("button", name="Open menu").first.click()
    ui.page.get_by_role("menuitem", name="Cancel").click()
    dialog = ui.page.get_by_role("dialog").or_(ui.page.get_by_role("alertdialog")).first
    dialog.get_by_text(f"rollout-{cancel_id}").wait_for()
    ui.shot("cancel-dialog")
    dialog.get_by_role("button", name="Cancel Flow Run").click()
    assert ui.wait_for_state({"Cancelled"}, 180) == "Cancelled"
    ui.shot("run-cancelled")
    assert api_get(lab, f"/flow_runs/{cancel_run}")["state_type"] == "CANCELLED"
    assert_never_live(lab, cancel_id)

    # back on the first store's run page, followed until it completes
    ui.page.goto(run_page)
    assert ui.wait_for_state({"Completed"}, 420) == "Completed"
    ui.page.get_by_role("heading", name=f"rollout-{done_id}").or_(
        ui.page.get_by_text(f"rollout-{done_id}", exact=True)).first.wait_for()
    ui.shot("run-completed")
    ui.tab("Task Runs")
    for step in STEPS:
        ui.page.get_by_text(f"{step}-{done_id}", exact=True).first.wait_for()
    ui.shot("run-task-runs")
    ui.tab("Artifacts")
    ui.page.get_by_text(f"rollout-{done_id}").first.wait_for()
    ui.shot("run-artifacts")
    ui.page.locator(f'a[href$="/artifacts/key/rollout-{done_id}"]').first.click()
    ui.page.locator('a[href*="/artifacts/artifact/"]').first.click()  # the newest version
    ui.page.get_by_role("heading", name=f"Store {done_id} rollout", exact=True).wait_for()
    ui.page.get_by_text(erp_notice_id(lab, done_id), exact=True).first.wait_for()  # the report
    started = api_get(lab, f"/flow_runs/{run_id}")  # the run is the one the form started
    assert started["name"] == f"rollout-{done_id}" and started["state_type"] == "COMPLETED"
    ui.shot("artifact")
    # the go-live gate's table: a row per check of the store server, every one passed
    ui.goto(f"/artifacts/key/go-live-{done_id}")
    ui.page.locator('a[href*="/artifacts/artifact/"]').first.click()  # the newest version
    ui.page.get_by_text("service pos_gateway (store-pos-gateway) runs", exact=True).wait_for()
    ui.page.get_by_text("answers at ", exact=False).first.wait_for()
    assert ui.page.get_by_text("FAIL", exact=True).count() == 0
    assert ui.page.get_by_text("pass", exact=True).count() >= 5
    ui.shot("go-live-table")

    # the store's Salt events in the event feed (stored a few seconds after the engine sends them)
    def feed_shows_the_vm() -> int:
        ui.goto('/v2/events?rangeType=span&seconds=-3600&events=["salt.store.vm.firstboot.done"]')
        ui.page.get_by_text("Event Feed").first.wait_for()
        ui.page.wait_for_load_state("networkidle")
        return int(ui.page.get_by_text(f"store-{done_id}-vm").count())

    wait_for(feed_shows_the_vm, timeout=60, interval=2,
             what=f"store-{done_id}-vm's firstboot event in the UI's event feed")
    ui.page.get_by_text(f"store-{done_id}-vm").first.wait_for(timeout=1000)
    ui.page.get_by_text(f"store {done_id}", exact=True).first.wait_for(timeout=1000)  # related
    ui.shot("event-feed")

    # the rollback run is visible in the UI and undid the store on the real systems
    ui.goto("/")
    ui.page.get_by_role("link", name="Runs", exact=True).click()
    ui.page.get_by_role("link", name=f"rollback-{cancel_id}").first.click()
    assert ui.wait_for_state({"Completed"}, 180) == "Completed"
    ui.shot("rollback-run")
    ui.park()
    try:
        assert_rolled_back(lab, cancel_id)  # its system disk gone, its data disk kept
    except AssertionError as exc:  # what the cancelled run and its clean-up did, to see why
        raise AssertionError(f"{exc}\n{run_logs(lab, f'rollout-{cancel_id}')}\n"
                             f"{run_logs(lab, f'rollback-{cancel_id}')}") from exc

    # a rerun of the rolled-out store that recreates its VM asks first: rejected, then approved
    check_approvals(lab, ui, Path(inventory), done_id)
    print(json.dumps({"screenshots": [str(p) for p in ui.taken]}))
