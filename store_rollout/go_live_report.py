"""The go-live gate's verdict: the store server's check rows (salt_states/_modules/storegate.py
runs them on the VM, through the master) read, judged and put in a table.

A store goes live, and the ERP hears of it, only when every check passed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError


class GoLiveCheck(BaseModel):
    check: str
    kind: str
    passed: bool
    observed: str
    expected: str


class GoLiveReport(BaseModel):
    store_id: str
    vm_minion: str
    checks: list[GoLiveCheck]

    @classmethod
    def from_rows(cls, store_id: str, vm_minion: str, rows: Any) -> GoLiveReport:
        """The report of what `storegate.run` returned; an answer that is not a list of check
        rows (an old module, a broken config), or no row at all, is one failed check saying
        so."""
        try:
            report = cls(store_id=store_id, vm_minion=vm_minion, checks=rows)
        except ValidationError:
            return cls(store_id=store_id, vm_minion=vm_minion, checks=[GoLiveCheck(
                check="the store server's checks ran", kind="gate", passed=False,
                observed=f"unreadable answer: {str(rows)[:200]}", expected="a row per check")])
        if not report.checks:
            report.checks = [GoLiveCheck(check="any check", kind="gate", passed=False,
                                         observed="none ran", expected="at least one")]
        return report

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[GoLiveCheck]:
        return [c for c in self.checks if not c.passed]

    def table(self) -> list[dict[str, str]]:
        """Rows for the run's table artifact."""
        return [{"check": c.check, "result": "pass" if c.passed else "FAIL",
                 "observed": c.observed, "expected": c.expected} for c in self.checks]

    def failure(self) -> str:
        """What a store technician reads on the failed run: the store and each failed check."""
        failed = "; ".join(f"{c.check}: {c.observed} (expected {c.expected})"
                           for c in self.failed)
        return (f"store {self.store_id}: go-live gate failed on {self.vm_minion}, the ERP was "
                f"not notified: {failed}. Fix it on the store server, then rerun the rollout: "
                "it resumes at the gate")
