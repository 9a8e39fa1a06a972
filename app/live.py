"""What a command shows while its flows run, as the step listener of the runs it starts in this
process (store_rollout/steps.listening): a table of stores x steps, or a progress bar per store
of a batch."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from store_rollout.contracts import STEPS


class LiveSteps:
    """A rich table of stores x steps: each step running, done (seconds) or failed."""

    def __init__(self, store_ids: list[str]) -> None:
        self.steps = STEPS
        self.state: dict[str, dict[str, str]] = {s: {} for s in store_ids}

    def __call__(self, store_id: str, step: str, state: str, seconds: float) -> None:
        label = {
            "running": "[yellow]running[/]",
            "done": f"[green]{seconds:.1f}s[/]",
            "failed": f"[red]failed {seconds:.1f}s[/]",
        }[state]
        self.state.setdefault(store_id, {})[step] = label

    def __rich__(self) -> Table:
        table = Table(title="store rollout")
        table.add_column("store")
        for step in self.steps:
            table.add_column(step.replace("_", " "))
        for sid, steps in self.state.items():
            table.add_row(sid, *[steps.get(step, "[dim]-[/]") for step in self.steps])
        return table


class BatchProgress:
    """One progress bar per store of a batch, advanced by each step it finishes; a context
    manager (the bars' display) and a step listener."""

    def __init__(self, store_ids: list[str], console: Console, disable: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[step]}"),
            TimeElapsedColumn(),
            console=console,
            disable=disable,
        )
        self.bars = {sid: self.progress.add_task(f"store {sid}", total=len(STEPS), step="queued")
                     for sid in store_ids}

    def __call__(self, store_id: str, step: str, state: str, _seconds: float) -> None:
        if store_id in self.bars:
            done = STEPS.index(step) + (1 if state == "done" else 0)
            self.progress.update(self.bars[store_id], completed=done, step=f"{step} {state}")

    def __enter__(self) -> BatchProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]
