"""What a command prints once its flow run has finished: one table (or line) per result, wide
enough not to wrap in a log."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_batch(rows: list[dict[str, Any]]) -> None:
    table = Table(title="batch")
    for col in ("store", "region", "state", "step reached", "seconds", "error or note"):
        table.add_column(col)
    for r in rows:
        earlier = r.get("earlier_run")
        table.add_row(r["store_id"], r.get("region", ""), r["state"], r["step_reached"],
                      str(r["seconds"]), f"already rolled out by {earlier}"[:100] if earlier
                      else r["error"][:80])
    Console(width=160).print(table)


def print_runs(found: dict[str, list[dict[str, Any]]]) -> None:
    """Past and running runs first, then the upcoming (scheduled) ones in their own table."""
    for key, title, when in (("runs", "recent runs", "started"),
                             ("upcoming", "upcoming runs", "scheduled for")):
        table = Table(title=title)
        for col in ("run", "flow", "state", when, "seconds"):
            table.add_column(col)
        for r in found[key]:
            table.add_row(str(r["name"]), str(r["flow"]), str(r["state"]), str(r["start"]),
                          str(r["seconds"]))
        if key == "runs" or found[key]:
            Console(width=160).print(table)


def print_plan(result: dict[str, Any]) -> None:
    out = Console(width=160)
    for sid, store in result.items():
        todo = store["todo"]
        platform = f" ({store['platform']})" if store.get("platform") else ""
        table = Table(title=f"store {sid}{platform}: " + (f"{len(todo)} steps to do, from "
                                                f"{store['resumes_at']}" if todo else
                                                "nothing to do"), show_lines=True)
        table.caption = "maintenance window: " + window_line(store.get("next_window"))
        if store.get("image"):
            image = store["image"]
            table.caption += (f"\nimage: running {image['running'] or '?'}, disk "
                              f"{image['disk'] or '?'}, target {image['target']}: "
                              f"{image['would']}")
        for col in ("step", "to do", "action", "details"):
            table.add_column(col)
        for step in store["steps"]:
            todo = ("[red]yes, destructive[/]" if step.get("destructive") else
                    "[yellow]yes[/]" if step["todo"] else "no")
            table.add_row(step["step"], todo, step["action"], "\n".join(step["details"]))
        out.print(table)


def window_line(window: dict[str, Any] | None) -> str:
    if window is None:
        return ("none: no calendar and no default one, so disruptive steps are refused (set "
                "the store's calendar or STORE_ROLLOUT_DEFAULT_*)")
    if "none" in window:
        return str(window["none"])
    return ("open now: " if window["open_now"] else "next: ") + str(window["text"])


def print_reconcile(result: dict[str, Any]) -> None:
    table = Table(title="reconcile: " + ", ".join(
        f"{n} {status}" for status, n in sorted(result["counts"].items())), show_lines=True)
    for col in ("store", "platform", "status", "last run", "systems", "mismatch → fix"):
        table.add_column(col)
    for sid, s in result["stores"].items():
        table.add_row(sid, s.get("platform", ""), s["status"], s["last_run"], s["real"], "\n".join(
            f"{m['what']} → {m['fix']}" for m in s["mismatches"]))
    Console(width=180).print(table)


def print_staged(result: dict[str, Any]) -> None:
    out = Console(width=160)  # the result: stdout (`stage ... > out.txt` holds it)
    for sid, staged in result["stores"].items():
        out.print(
            f"store {sid}: image {staged.get('image_version') or 'unversioned'} "
            f"({staged['image_key'][:12]}) on {staged['hypervisor']}: "
            + (
                "already there"
                if staged["cached"]
                else f"{staged['transferred']} bytes in {staged['seconds']}s"
            )
        )
