"""Per-step fault knobs of the simulated hardware and the count of what they did."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

# old_host_salt: the next installed host runs Leap 15.6's stock Salt 3006.0 on Python 3.6;
# service_start: at a machine's next boot its enabled units fail to start (the step's own knob:
# taken at a boot of a machine that has enabled units, a store VM's once its highstate enabled
# the store server's services; a technician's later start works); a machine's own knob: at that
# machine's next boot whatever it has, and every start of a unit fails for the rest of that boot
# (e.g. an image update's boot of a new system disk, whose update highstate then fails)
# A knob named `<step>@<machine>` (a minion id, or a domain's or store host's name) applies to
# that machine only, and before the step's own knob: `service_start@store-0003-vm`.
MACHINE_SEPARATOR = "@"
MACHINE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
STEPS = ("pxe", "startup_highstate", "vm_boot", "reboot", "vm_start", "old_host_salt",
         "service_start")


class FaultKnobs:
    """Per-step faults: {"delay": s, "fail": n, "never": bool}; `fail` counts down per use.

    `taken` counts what the knobs really did (delays applied, failures caused), so a test can
    show its fault happened instead of assuming it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.knobs: dict[str, dict[str, Any]] = {}
        self.taken: dict[str, dict[str, int]] = {}

    def set(self, step: str, knob: dict[str, Any]) -> None:
        """`step` is a step (every machine) or `<step>@<machine>` (that machine only)."""
        name, _, machine = step.partition(MACHINE_SEPARATOR)
        if name not in STEPS:
            raise ValueError(f"unknown step {name!r}; choose one of {', '.join(STEPS)} "
                             f"(optionally <step>{MACHINE_SEPARATOR}<machine>)")
        if MACHINE_SEPARATOR in step and not MACHINE_RE.fullmatch(machine):
            raise ValueError(f"fault knob {step!r}: the machine after "
                             f"{MACHINE_SEPARATOR!r} must be a minion id or a domain name")
        with self.lock:
            self.knobs[step] = {"delay": float(knob.get("delay", 0)),
                                "fail": int(knob.get("fail", 0)),
                                "never": bool(knob.get("never", False))}

    def clear(self, step: str | None = None) -> None:
        with self.lock:
            if step is None:
                self.knobs.clear()
                self.taken.clear()
            else:
                self.knobs.pop(step, None)
                self.taken.pop(step, None)

    def take(self, step: str, *machines: str, own_only: bool = False) -> tuple[float, bool]:
        """(delay, fails_now) for one use of `step` by the machine known by `machines` (its
        names): the first `<step>@<machine>` knob set for one of them, else `step`'s own (not
        with `own_only`). Counted in `taken` under the knob's name."""
        with self.lock:
            names = [f"{step}{MACHINE_SEPARATOR}{machine}" for machine in machines if machine]
            step = next((name for name in names if self.knobs.get(name)),
                        "" if own_only else step)
            knob = self.knobs.get(step)
            if not knob:
                return 0.0, False
            fails = knob["never"] or knob["fail"] > 0
            if fails and not knob["never"]:
                knob["fail"] -= 1
            counts = self.taken.setdefault(step, {"delayed": 0, "failed": 0})
            counts["delayed"] += knob["delay"] > 0
            counts["failed"] += fails
            return knob["delay"], fails

    def armed(self, step: str, machine: str) -> bool:
        """A knob of this machine's own for `step` will fail its next use."""
        with self.lock:
            knob = self.knobs.get(f"{step}{MACHINE_SEPARATOR}{machine}")
            return bool(knob and (knob["never"] or knob["fail"] > 0))

    def taken_snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return json.loads(json.dumps(self.taken))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return json.loads(json.dumps(self.knobs))
