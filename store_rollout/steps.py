"""Step bookkeeping shared by the flow and the CLI: durations, live progress, the run report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from store_rollout.contracts import STEPS

T = TypeVar("T")

# in-process listeners (the CLI's live view); runs on workers simply have none
_listeners: list[Callable[[str, str, str, float], None]] = []
_lock = threading.Lock()
# store -> the step its run in this process failed in, for the run's failure hook
_failed: dict[str, str] = {}


def add_listener(fn: Callable[[str, str, str, float], None]) -> None:
    with _lock:
        _listeners.append(fn)


def remove_listener(fn: Callable[[str, str, str, float], None]) -> None:
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


def _notify(store_id: str, step: str, state: str, seconds: float) -> None:
    with _lock:
        listeners = list(_listeners)
    for fn in listeners:
        fn(store_id, step, state, seconds)


class StepClock:
    """Times each step of one store's rollout and tells listeners about it."""

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
        f"- ERP id: **{result.get('erp_id')}**\n\n"
        f"| step | seconds |\n|---|---|\n{rows}\n"
    )
