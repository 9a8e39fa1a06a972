"""tasks.erp's notify_erp task: its Prefect retries are the one retry layer of the ERP call
(docs/reliability.md, "Retries and timeouts"), reached for real against a scripted ERP on
127.0.0.1. Delays are set through the task's own options, nothing patched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from prefect import flow
from prefect.blocks.system import Secret

from store_rollout.inventory import Store, parse_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import ErpSettings
from tasks.erp import ErpUnavailable, notify_erp
from tasks.retry import ERP_RETRY
from tests.helpers import BASE_ENV
from tests.local_servers import ERP_CREATED, ScriptedErp, serving

STORE = parse_inventory({"stores": [{
    "store_id": "0042", "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01"},
    "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
    "erp": {"site_code": "DE-0042"}}]}).stores[0]
VM = {"domain": "store-0042-vm", "uuid": "6f1c0d2e-0000-4000-8000-000000000042"}



@pytest.fixture
def erp_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Settings (env) of a non-lab run whose ERP answers the statuses given, then 201 with an id;
    yields that factory."""
    monkeypatch.delenv("STORE_ROLLOUT_SETTINGS_FILE", raising=False)
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)

    with ExitStack() as servers:
        def make(statuses: list[int]) -> ScriptedErp:
            Secret(value="t").save(BASE_ENV["STORE_ROLLOUT_ERP_TOKEN_BLOCK"], overwrite=True)
            erp = ScriptedErp([(status, b'{"error": "no"}') for status in statuses] + [ERP_CREATED])
            monkeypatch.setenv("STORE_ROLLOUT_ERP_URL", servers.enter_context(serving(erp)))
            monkeypatch.setenv("STORE_ROLLOUT_ERP_TIMEOUT_SECONDS", "5")
            return erp

        yield make


@flow(name="notify-erp-only")
def notify_only(store: Store, vm: dict[str, Any]) -> dict[str, Any]:
    # the production task with its production retries and retry condition; only no waiting
    # settings loaded once by the flow, its ERP part handed to the task
    erp = ErpSettings.of(load_settings())
    return notify_erp.with_options(retry_delay_seconds=0)(store, vm, erp)


@pytest.mark.parametrize("status", [503, 429])
def test_erp_transient_answers_are_retried_by_the_task_alone(
        prefect_harness: None, erp_with: Any, status: int) -> None:
    erp = erp_with([status] * ERP_RETRY.retries)  # fails every attempt but the last
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["erp_id"] == "ERP-7"
    # exactly one POST per task attempt: no transport retries underneath
    assert len(erp.received) == ERP_RETRY.retries + 1
    assert len({r["headers"]["Idempotency-Key"] for r in erp.received}) == 1  # every retry is the same notice


def test_erp_gives_up_after_the_tasks_attempts(prefect_harness: None, erp_with: Any) -> None:
    erp = erp_with([503] * (ERP_RETRY.retries + 1))
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_failed()
    with pytest.raises(ErpUnavailable, match="HTTP 503"):
        state.result()
    assert len(erp.received) == ERP_RETRY.retries + 1


def test_erp_4xx_is_not_retried(prefect_harness: None, erp_with: Any) -> None:
    erp = erp_with([400])
    state = notify_only(STORE, VM, return_state=True)
    assert state.is_failed() and "HTTP 400" in str(state.message)
    assert len(erp.received) == 1
