"""The plan as Markdown and the reconcile table, as the flows' artifacts show them."""

from __future__ import annotations

from store_rollout.fleet.plan import StepPlan
from store_rollout.fleet.reconcile import StoreStatus


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def plan_markdown(plans: dict[str, list[StepPlan]],
                  platforms: dict[str, str] | None = None) -> str:
    """The plans; `platforms`: each store's platform, shown beside its id."""
    lines = ["# Rollout plan", ""]
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
             "mismatch": "; ".join(m.what for m in s.mismatches),
             "fix": "; ".join(m.fix for m in s.mismatches), "fingerprint": s.fingerprint()}
            for s in statuses]
