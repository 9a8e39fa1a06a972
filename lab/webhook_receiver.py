"""The lab's chat channel: a webhook endpoint that records every notification Prefect's
automations send it (through the lab's notification block) as a JSON line, so tests count
them.

API:
  POST /notify       any JSON body (the block sends {"subject", "body"}); recorded, 200
  GET /_lab/health   "ok"

Run: python -m lab.webhook_receiver --port P --log FILE
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lab.jsonhttp import JsonHandler


def make_handler(log: Path) -> type[JsonHandler]:
    lock = threading.Lock()

    class Handler(JsonHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/notify":
                self._reply(404, {"error": f"no {self.path}: POST /notify"})
                return
            try:
                message: Any = self._json()
            except json.JSONDecodeError:
                self._reply(400, {"error": "the body is not JSON"})
                return
            with lock, log.open("a") as out:
                out.write(json.dumps({"received": time.time(), "message": message}) + "\n")
            self._reply(200, {"recorded": True})

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/_lab/health":
                self._reply(200, "ok")
            else:
                self._reply(404, {"error": f"no {self.path}"})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.log))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
