"""Tiny servers on 127.0.0.1 for the client unit tests: each runs in a thread of the test and is
shut down when its `with` block (a fixture's finalizer) ends."""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ERP_CREATED = (201, json.dumps({"id": "ERP-7", "replay": False}).encode())


@contextmanager
def serving(server: socketserver.TCPServer) -> Iterator[str]:
    """Serve `server` (bound to 127.0.0.1:0) in a thread; yields its http://127.0.0.1:port."""
    port = server.socket.getsockname()[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class ScriptedErp(ThreadingHTTPServer):
    """An ERP that answers the (status, body) pairs of `script` in turn (the last one repeats)
    and records every request it receives: path, headers and JSON body."""

    def __init__(self, script: list[tuple[int, bytes]] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedErpHandler)
        self.script: list[tuple[int, bytes]] = list(script or [ERP_CREATED])
        self.received: list[dict[str, Any]] = []


class _ScriptedErpHandler(BaseHTTPRequestHandler):
    server: ScriptedErp

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append({"path": self.path, "headers": dict(self.headers),
                                     "json": json.loads(body)})
        script = self.server.script
        status, answer = script.pop(0) if len(script) > 1 else script[0]
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def refused_url() -> str:
    """A URL on which nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def silent_url() -> Iterator[str]:
    """A port that completes the TCP handshake (kernel backlog) but never answers: a read
    timeout."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


class _ResetHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(65536)
        # linger 0: close() sends RST instead of FIN, the client sees "connection reset"
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def finish(self) -> None:
        self.request.close()


class _ResetServer(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def shutdown_request(self, request: Any) -> None:  # no shutdown(SHUT_WR): no FIN
        self.close_request(request)


@contextmanager
def resetting_url() -> Iterator[str]:
    """A server that reads the request and resets the connection."""
    with serving(_ResetServer(("127.0.0.1", 0), _ResetHandler)) as url:
        yield url
