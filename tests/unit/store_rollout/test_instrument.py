"""store_rollout.instrument: the seconds a rollout spends inside outside systems follow the flow
into its task runs (bench_overhead reads them; its quick run is in `make test-bench`)."""

from __future__ import annotations

import time

from prefect import flow, task

from store_rollout.instrument import add, external, measuring


@task
def call_salt(seconds: float) -> None:
    with external("salt"):
        time.sleep(seconds)


@flow
def two_calls() -> None:
    call_salt(0.05)
    call_salt.submit(0.05).result()  # a task run in another thread of the flow


def test_external_time_follows_the_flow_into_its_task_runs(prefect_harness: None) -> None:
    with measuring() as spent:
        two_calls()
        add("hardware_wait", 1.5)
    assert 0.1 <= spent["salt"] < 1.0, dict(spent)
    assert spent["hardware_wait"] == 1.5 and "cobbler" not in spent


def test_nothing_is_counted_when_nobody_measures() -> None:
    with external("salt"):
        pass
    add("salt", 3.0)
    with measuring() as spent:
        pass
    assert dict(spent) == {}
