"""The plan as Markdown and the reconcile table, as the flows' artifacts show them."""

from __future__ import annotations

from store_rollout.fleet.plan import StepPlan
from store_rollout.fleet.reconcile import StoreStatus
from store_rollout.fleet.versions import StoreVersions, version_line


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def versions_markdown(versions: dict[str, StoreVersions],
                      windows: dict[str, str] | None = None) -> list[str]:
    """The image versions table of a plan: per store running, disk, target, staged, window and
    what an update would do."""
    lines = ["## Image versions", "",
             "| store | running (VM) | disk (host) | target | staged | window | would |",
             "|---|---|---|---|---|---|---|"]
    staged = {True: "yes", False: "no", None: "?"}
    for sid, v in versions.items():
        lines.append(f"| {sid} | {v.running or '?'} | {v.disk or '?'} | {v.target} | "
                     f"{staged[v.staged]} | {_cell((windows or {}).get(sid, '-'))} | "
                     f"{_cell(v.would)} |")
    return [*lines, ""]


def plan_markdown(plans: dict[str, list[StepPlan]],
                  platforms: dict[str, str] | None = None,
                  versions: dict[str, StoreVersions] | None = None,
                  windows: dict[str, str] | None = None) -> str:
    """The plans; `platforms`: each store's platform, shown beside its id; `versions`: each
    store's image versions (a table first), `windows`: its window, one line."""
    lines = ["# Rollout plan", ""]
    if versions:
        lines += versions_markdown(versions, windows)
    for store_id, plan in plans.items():
        todo = [p for p in plan if p.todo]
        platform = (platforms or {}).get(store_id)
        lines += [f"## Store {store_id}{f' ({platform})' if platform else ''}: "
                  + (f"{len(todo)} of {len(plan)} steps to do" if todo else "nothing to do"), "",
                  "| step | to do | action | details |", "|---|---|---|---|"]
        for p in plan:
            details = "<br>".join(_cell(d) for d in p.details)
            to_do = "**yes, destructive**" if p.destructive else "yes" if p.todo else "no"
            lines.append(f"| {p.step} | {to_do} | {_cell(p.action)} | "
                         f"{details} |")
        lines.append("")
    return "\n".join(lines)


def reconcile_table(statuses: list[StoreStatus]) -> list[dict[str, str]]:
    """Rows of the reconcile table artifact (one per store)."""
    return [{"store": s.store_id, "platform": s.platform, "status": s.status,
             "last run": s.last_run, "systems": s.real,
             "image version": version_line(s.versions) if s.versions else "-",
             "last backup": s.last_backup or "-",
             "mismatch": "; ".join(m.what for m in s.mismatches),
             "fix": "; ".join(m.fix for m in s.mismatches), "fingerprint": s.fingerprint()}
            for s in statuses]
