"""The lab's image server: the image cache over HTTP, as any static server would serve it in
production (`<image_base_url>/<key>/image.qcow2` and `meta.json`), with byte ranges.

For tests it counts the body bytes it sent per path (`GET /_lab/stats`, `DELETE /_lab/stats`)
and takes faults for the next image response (`POST /_lab/faults`; `GET /_lab/faults` shows the
ones not yet taken, `DELETE /_lab/faults` drops them):
`{"cut_after": n}` closes the connection after n body bytes (a cut WAN link),
`{"flip_byte_at": offset}` flips one byte at that file offset in transit (a corrupted transfer).

Run: python -m lab.image_server --root <image cache> --port <port>
"""

from __future__ import annotations

import argparse
import re
import ssl
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lab.jsonhttp import JsonHandler

# a delta (store_rollout/image_delta.py) is served like the image it rebuilds
SERVED = re.compile(
    r"^/([A-Za-z0-9][A-Za-z0-9._-]*)/(image\.qcow2|meta\.json|delta-from-[A-Za-z0-9._-]+\.qcow2)$")
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
CHUNK = 256 * 1024


class ImageServerState:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        self.faults: dict[str, int] = {}

    def count(self, path: str, n: int) -> None:
        with self.lock:
            self.sent[path] = self.sent.get(path, 0) + n

    def take_faults(self) -> dict[str, int]:
        with self.lock:
            faults, self.faults = self.faults, {}
            return faults


def make_handler(state: ImageServerState) -> type[JsonHandler]:
    class Handler(JsonHandler):
        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(body=False)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/_lab/health":
                self._reply(200, {"ok": True})
            elif self.path == "/_lab/faults":
                with state.lock:
                    self._reply(200, {"faults": dict(state.faults)})
            elif self.path == "/_lab/stats":
                with state.lock:
                    self._reply(200, {"sent": dict(state.sent),
                                         "requests": list(state.requests)})
            else:
                self._serve(body=True)

        def do_DELETE(self) -> None:  # noqa: N802
            if self.path == "/_lab/faults":
                state.take_faults()
                self._reply(200, {"faults": {}})
            elif self.path == "/_lab/stats":
                with state.lock:
                    state.sent.clear()
                    state.requests.clear()
                self._reply(200, {"cleared": True})
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/_lab/faults":
                self._reply(404, {"error": "not found"})
                return
            body = self._json()
            faults = {k: int(v) for k, v in body.items() if k in ("cut_after", "flip_byte_at")}
            with state.lock:
                state.faults = faults
            self._reply(200, {"faults": faults})

        def _serve(self, body: bool) -> None:
            match = SERVED.match(self.path)
            path = state.root / match[1] / match[2] if match else None
            if path is None or not path.is_file():
                self._reply(404, {"error": f"no such image file: {self.path}"})
                return
            size = path.stat().st_size
            start, end, status = 0, size - 1, 200
            header = self.headers.get("Range")
            if header:
                ranged = RANGE.match(header.strip())
                if not ranged or int(ranged[1]) >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = int(ranged[1])
                end = min(int(ranged[2]), size - 1) if ranged[2] else size - 1
                status = 206
            with state.lock:
                state.requests.append({"path": self.path, "range": header, "status": status})
            self.send_response(status)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if not body:
                return
            faults = state.take_faults() if match and match[2] == "image.qcow2" else {}
            budget = faults.get("cut_after")
            flip = faults.get("flip_byte_at")
            with path.open("rb") as fh:
                fh.seek(start)
                offset = start
                while offset <= end:
                    chunk = bytearray(fh.read(min(CHUNK, end - offset + 1)))
                    if not chunk:
                        break
                    if flip is not None and offset <= flip < offset + len(chunk):
                        chunk[flip - offset] ^= 0xFF
                    if budget is not None:
                        chunk = chunk[:budget]
                        budget -= len(chunk)
                    self.wfile.write(chunk)
                    state.count(self.path, len(chunk))
                    offset += len(chunk)
                    if budget is not None and budget <= 0:
                        self.close_connection = True
                        return

    return Handler


def serve(root: Path, host: str, port: int,
          tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """The server (not yet serving); `tls` makes it HTTPS."""
    server = ThreadingHTTPServer((host, port), make_handler(ImageServerState(root)))
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(args.root, args.host, args.port).serve_forever()


if __name__ == "__main__":
    main()
