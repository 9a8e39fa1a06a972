"""`store-rollout` command line: the lab, single rollouts and the demo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Roll out retail stores: KIWI image, Cobbler PXE, Salt, libvirt, ERP.")
lab_app = typer.Typer(no_args_is_help=True, help="The local lab (real services, simulated hardware).")
app.add_typer(lab_app, name="lab")
console = Console(stderr=True)

StateDir = Annotated[Path | None, typer.Option("--state-dir", help="lab state dir (default .lab/)")]


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f} MiB"


@lab_app.command("up")
def lab_up(state_dir: StateDir = None) -> None:
    """Start (or repair) the lab; prints where lab.json is."""
    from lab.manager import Lab

    lab = Lab.at(state_dir)
    try:
        lab.up(progress=lambda m: console.print(f"[dim]lab:[/] {m}"))
    except Exception as exc:
        console.print(f"[red]lab up failed:[/] {exc}\nlogs: {lab.paths.logs}")
        raise typer.Exit(1) from exc
    console.print(f"lab ready: {lab.paths.lab_json}")


@lab_app.command("status")
def lab_status(state_dir: StateDir = None,
               as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Each service, its address, PID and RSS (process tree)."""
    from lab.manager import Lab

    lab = Lab.at(state_dir)
    rows = lab.status()
    minions = lab.minion_rows()
    total = sum(r["rss_bytes"] for r in rows)
    if as_json:
        print(json.dumps({"services": rows, "minions": minions, "total_rss_bytes": total},
                         indent=2))
        return
    table = Table(title=f"lab at {lab.paths.root}")
    for col in ("service", "address", "pid", "state", "rss"):
        table.add_column(col)
    for r in [*rows, *minions]:
        table.add_row(r["service"], r["address"], str(r["pid"]),
                      "running" if r["alive"] else "[red]dead[/]", _mib(r["rss_bytes"]))
    table.add_row("total (services)", "", "", "", _mib(total))
    Console().print(table)
    if rows and not all(r["alive"] for r in rows):
        raise typer.Exit(1)


@lab_app.command("down")
def lab_down(state_dir: StateDir = None,
             purge: Annotated[bool, typer.Option(help="also delete the state dir")] = False) -> None:
    """Stop everything the lab started (by PID / process group)."""
    from lab.manager import Lab

    Lab.at(state_dir).down(purge=purge)
    console.print("lab down")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
