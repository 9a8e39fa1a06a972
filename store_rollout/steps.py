"""Step bookkeeping shared by the flow and the CLI: durations, live progress, the run report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from store_rollout.backups import restored_line
from store_rollout.contracts import STEPS

T = TypeVar("T")
# told of each step of a store's run: (store_id, step, "running" | "done" | "failed", seconds)
StepListener = Callable[[str, str, str, float], None]

# who hears of the steps the runs started in this context run (the CLI's live view, a batch's
# row): set for a block by `listening`, seen by the threads and task runs started inside it
# (they run in a copy of it: Prefect's task runners copy the context); runs on workers have none
_LISTENING: ContextVar[tuple[StepListener, ...]] = ContextVar("step_listeners", default=())
_lock = threading.Lock()
# store -> the step its run in this process failed in, for the run's failure hook
_failed: dict[str, str] = {}


@contextmanager
def listening(listener: StepListener) -> Iterator[None]:
    """`listener` hears of every step of the rollouts run inside this block (in this thread, and
    in the threads and task runs started from it), besides whoever listens around it."""
    token = _LISTENING.set((*_LISTENING.get(), listener))
    try:
        yield
    finally:
        _LISTENING.reset(token)


def _notify(store_id: str, step: str, state: str, seconds: float) -> None:
    for fn in _LISTENING.get():
        fn(store_id, step, state, seconds)


class LastStep:
    """A step listener keeping the last step `store_id`'s run reached ("validation" before its
    first step: the run failed checking its input)."""

    def __init__(self, store_id: str) -> None:
        self.store_id = store_id
        self.step = "validation"

    def __call__(self, store_id: str, step: str, _state: str, _seconds: float) -> None:
        if store_id == self.store_id:
            self.step = step


class StepClock:
    """Times each step of one store's rollout and tells the listeners of its context about it."""

    def __init__(self, store_id: str) -> None:
        self.store_id = store_id
        self.seconds: dict[str, float] = {}
        take_failed_step(store_id)  # a run of this store before, in this process, is over

    def run(self, step: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one step; a Prefect task's run is named `<step>-<store>` (what the UI lists)."""
        with_options = getattr(fn, "with_options", None)
        if with_options is not None:
            fn = with_options(task_run_name=f"{step}-{self.store_id}")
        _notify(self.store_id, step, "running", 0.0)
        started = time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            self.seconds[step] = round(time.monotonic() - started, 3)
            with _lock:
                _failed[self.store_id] = step
            _notify(self.store_id, step, "failed", self.seconds[step])
            raise
        self.seconds[step] = round(time.monotonic() - started, 3)
        _notify(self.store_id, step, "done", self.seconds[step])
        return result


def take_failed_step(store_id: str) -> str | None:
    """The step the store's run in this process failed in (once), None if none failed."""
    with _lock:
        return _failed.pop(store_id, None)


def markdown_report(store_id: str, result: dict[str, Any]) -> str:
    rows = "\n".join(f"| {step} | {result['step_seconds'].get(step, '-')} |" for step in STEPS)
    vm = result.get("vm", {})
    return (
        f"# Store {store_id} rollout\n\n"
        f"- hypervisor: `{result.get('hypervisor')}` (PXE-installed by this run: "
        f"{result.get('hypervisor_reinstalled')})\n"
        f"- VM: `{vm.get('domain')}` (uuid `{vm.get('uuid')}`), minion `{result.get('vm_minion')}`\n"
        f"- VM disk: `{vm.get('disk')}` on base `{vm.get('backing')}`\n"
        f"- image: `{result.get('image_key', '')[:16]}` (cache hit: {result.get('image_cache_hit')})\n"
        f"{transfer_line(vm.get('image_delivery'))}"
        f"- ERP id: **{result.get('erp_id')}**\n"
        f"{restored_line(result.get('restored_backup'))}\n"
        f"| step | seconds |\n|---|---|\n{rows}\n"
    )


def transfer_rate(delivered: dict[str, Any] | None) -> float | None:
    """The image transfer's rate in bytes/s, None when nothing was transferred by this run (the
    base image was there, staged, or the domain reused)."""
    if not delivered or delivered.get("cached") or not delivered.get("transferred"):
        return None
    seconds = float(delivered.get("seconds") or 0)
    return float(delivered["transferred"]) / seconds if seconds > 0 else None


def transfer_line(delivered: dict[str, Any] | None) -> str:
    """Step 5's image transfer in one line of the run's artifact: bytes, seconds and rate (what
    the store's link gave)."""
    rate = transfer_rate(delivered)
    if delivered is None or rate is None:
        return "- image transfer: none by this run (the base image was on the host)\n"
    resumed = delivered.get("resumed_from") or 0
    return (f"- image transfer: {delivered['transferred']:,} bytes in "
            f"{float(delivered['seconds']):.1f} s = **{rate * 8 / 1e6:.2f} Mbit/s**"
            + (f" (resumed at byte {resumed:,})" if resumed else "") + "\n")
