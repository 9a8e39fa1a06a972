"""The lab ERP: records every notice request it gets as a JSON line, and can be told to misbehave.

API (all JSON):
  POST /api/v1/store-rollouts      a rollout notice; needs `Authorization: Bearer <token>`;
                                   honours `Idempotency-Key` (same key -> same ERP id, 200)
  GET /api/v1/store-rollouts?store_id=S
                                   the notices the ERP holds for store S (same token):
                                   {"notices": [{"id", "idempotency_key", "vm_uuid", "received"}]};
                                   a read, not recorded in the log
  POST /_lab/faults                {"status": 503, "count": 3} | {"delay": 5, "count": 1} |
                                   {"drop": true, "count": 1} ; applies to the next `count` notices
  GET /_lab/faults                 {"faults": [...]}: the faults not yet used up
  DELETE /_lab/faults              clear faults
  GET /_lab/health                 "ok"

Run: python -m lab.erp_receiver --port P --log FILE --token-file F
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lab.jsonhttp import JsonHandler


class ErpState:
    def __init__(self, log_path: Path, token_file: Path) -> None:
        self.log_path = log_path
        self.token_file = token_file
        self.lock = threading.Lock()
        self.faults: list[dict[str, Any]] = []
        self.ids_by_key: dict[str, str] = {}
        self.notices: dict[str, dict[str, Any]] = {}  # ERP id -> what a GET lists
        self._load_ids()

    def _load_ids(self) -> None:
        # a restarted receiver still honours idempotency keys it answered before
        if not self.log_path.exists():
            return
        for line in self.log_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("status") in (200, 201) and rec.get("idempotency_key") and rec.get("erp_id"):
                self.ids_by_key[rec["idempotency_key"]] = rec["erp_id"]
                self.remember(rec)

    def remember(self, entry: dict[str, Any]) -> None:
        """The first notice of an ERP id (a replay keeps the first one's data)."""
        payload = entry.get("payload") or {}
        self.notices.setdefault(entry["erp_id"], {
            "id": entry["erp_id"], "idempotency_key": entry["idempotency_key"],
            "store_id": payload.get("store_id"), "received": entry["received"],
            "vm_uuid": (payload.get("vm") or {}).get("uuid"), "status": payload.get("status")})

    def notices_of(self, store_id: str) -> list[dict[str, Any]]:
        with self.lock:
            found = [n for n in self.notices.values() if n["store_id"] == store_id]
        return [{k: v for k, v in n.items() if k != "store_id"}
                for n in sorted(found, key=lambda n: n["received"])]

    def authorized(self, header: str | None) -> bool:
        """Any token listed in the token file (re-read per request, so tests can add one)."""
        tokens = {t.strip() for t in self.token_file.read_text().splitlines() if t.strip()}
        return header is not None and header.startswith("Bearer ") and header[7:] in tokens

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock, open(self.log_path, "a") as log:
            log.write(json.dumps(entry, sort_keys=True) + "\n")

    def next_fault(self) -> dict[str, Any] | None:
        with self.lock:
            if not self.faults:
                return None
            fault = self.faults[0]
            fault["count"] -= 1
            if fault["count"] <= 0:
                self.faults.pop(0)
            return dict(fault)


def make_handler(state: ErpState) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if self.path == "/_lab/health":
                self._reply(200, "ok")
            elif self.path == "/_lab/faults":
                with state.lock:
                    self._reply(200, {"faults": [dict(f) for f in state.faults]})
            elif url.path == "/api/v1/store-rollouts":
                if not state.authorized(self.headers.get("Authorization")):
                    self._reply(401, {"error": "missing or wrong bearer token"})
                    return
                store_id = urllib.parse.parse_qs(url.query).get("store_id", [""])[0]
                if not store_id:
                    self._reply(422, {"error": "query parameter store_id is required"})
                    return
                self._reply(200, {"notices": state.notices_of(store_id)})
            else:
                self._reply(404, {"error": "not found"})

        def do_DELETE(self) -> None:
            if self.path == "/_lab/faults":
                with state.lock:
                    state.faults.clear()
                self._reply(200, {"faults": []})
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            raw = self._body()
            if self.path == "/_lab/faults":
                fault = json.loads(raw or b"{}")
                fault.setdefault("count", 1)
                with state.lock:
                    state.faults.append(fault)
                self._reply(200, {"faults": state.faults})
                return
            if self.path != "/api/v1/store-rollouts":
                self._reply(404, {"error": "not found"})
                return
            self._notice(raw)

        def _notice(self, raw: bytes) -> None:
            received = time.time()
            key = self.headers.get("Idempotency-Key")
            try:
                payload: Any = json.loads(raw)
            except json.JSONDecodeError:
                payload = None
            entry: dict[str, Any] = {
                "received": received, "path": self.path, "idempotency_key": key,
                "payload": payload,
                "authorized": state.authorized(self.headers.get("Authorization")),
            }
            fault = state.next_fault()
            if fault:
                entry["fault"] = {k: v for k, v in fault.items() if k != "count"}  # test evidence
            if fault and fault.get("delay"):
                time.sleep(float(fault["delay"]))
            if fault and fault.get("drop"):
                entry["status"] = "dropped"
                state.record(entry)
                self.close_connection = True
                self.connection.close()
                return
            if fault and fault.get("status"):
                entry["status"] = int(fault["status"])
                state.record(entry)
                self._reply(int(fault["status"]), {"error": "injected fault"})
                return
            if not entry["authorized"]:
                entry["status"] = 401
                state.record(entry)
                self._reply(401, {"error": "missing or wrong bearer token"})
                return
            if not isinstance(payload, dict) or not payload.get("store_id"):
                entry["status"] = 422
                state.record(entry)
                self._reply(422, {"error": "payload must be an object with store_id"})
                return
            with state.lock:
                known = state.ids_by_key.get(key) if key else None
                erp_id = known or f"ERP-{uuid.uuid4().hex[:12]}"
                if key:
                    state.ids_by_key[key] = erp_id
            entry.update(status=200 if known else 201, erp_id=erp_id, replay=bool(known))
            state.record(entry)
            with state.lock:
                state.remember(entry)
            self._reply(200 if known else 201, {"id": erp_id, "replay": bool(known)})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    args = parser.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.touch()
    state = ErpState(args.log, args.token_file)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
