"""The simulator's HTTP API: fault knobs, minion status and reboots, the vm_start hook (the
store hosts' power is their BMCs', lab/bmc_service.py)."""

from __future__ import annotations

import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from lab.hardware import host_of
from lab.jsonhttp import JsonHandler

if TYPE_CHECKING:
    from lab.simulator.server import Simulator


def make_handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, "ok")
            elif self.path == "/minions":
                self._reply(200, {"running": sim.minions.status(),
                                  "history": sim.minions.history[-200:]})
            elif self.path == "/faults":
                self._reply(200, sim.faults.snapshot())
            elif self.path == "/faults/taken":
                self._reply(200, sim.faults.taken_snapshot())
            else:
                self._reply(404, {"error": "not found"})

        def do_DELETE(self) -> None:
            match = re.fullmatch(r"/faults(?:/([\w@.-]+))?", self.path)
            if match:
                sim.faults.clear(match.group(1))
                self._reply(200, sim.faults.snapshot())
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            try:
                body = self._json()
                if self.path == "/hooks/vm_start":
                    if host_of(str(body.get("xml") or "<domain/>")) is not None:
                        # a store host powered on by its BMC: the knob is the store VMs'
                        self._reply(200, {"fail": False, "domain": body.get("domain")})
                        return
                    delay, fail = sim.faults.take("vm_start", str(body.get("domain") or ""))
                    time.sleep(delay)
                    self._reply(200, {"fail": fail, "domain": body.get("domain")})
                elif m := re.fullmatch(r"/minions/([^/]+)/reboot", self.path):
                    self._reply(200, sim.firmware.reboot(m.group(1)))
                elif m := re.fullmatch(r"/faults/([\w@.-]+)", self.path):
                    sim.faults.set(m.group(1), body)
                    self._reply(200, sim.faults.snapshot())
                else:
                    self._reply(404, {"error": "not found"})
            except ValueError as exc:
                self._reply(400, {"error": str(exc)})

    return Handler

