"""The simulator's wiring and entry point: `python -m lab.simulator --state-dir <lab> --port <port>`."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lab.simulator.faults import FaultKnobs
from lab.simulator.firmware import Firmware
from lab.simulator.http_api import make_handler
from lab.simulator.minions import MinionManager
from lab.simulator.vm_boot import VmBoot
from lab.state import LabPaths


class Simulator:
    def __init__(self, paths: LabPaths) -> None:
        info = paths.load_info()
        if info is None:
            raise SystemExit("simulator: lab.json missing")
        self.paths = paths
        self.info = info
        self.faults = FaultKnobs()
        self.minions = MinionManager(paths, info, self.faults)
        self.stopping = threading.Event()
        self.vms = VmBoot(paths, info, self.faults, self.minions, self.stopping)
        self.firmware = Firmware(paths, info, self.faults, self.minions, self.vms)
        self.vms.hosts = self.firmware


def main() -> None:
    parser = argparse.ArgumentParser(description="store hardware simulator")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    sim = Simulator(LabPaths(args.state_dir))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(sim))
    server.daemon_threads = True

    def shutdown(*_: Any) -> None:
        sim.stopping.set()
        sim.minions.stop_all()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, shutdown)
    threading.Thread(target=sim.vms.run_libvirt_events, daemon=True, name="libvirt-events").start()
    server.serve_forever()

