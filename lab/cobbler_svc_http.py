"""Cobbler's HTTP side without Apache: the stock svc WSGI app under wsgiref.

Run with the Cobbler venv's python INSIDE cobblerd's mount namespace (nsenter -t <pid> -m), because
services.py reads /etc/cobbler/settings.yaml and imports from /var/www/cobbler/svc, which exist only
in the overlays there.  Usage: python cobbler_svc_http.py <port>

Serves /cblr/svc/... (autoinstall, nopxe, ...), /cobbler_api (the XML-RPC proxy Apache normally
provides, which the stock `cobbler` CLI needs) and static files under /cobbler/.
"""

from __future__ import annotations

import mimetypes
import os
import socketserver
import sys
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import yaml

SVC_DIR = "/var/www/cobbler/svc"
WWW_DIR = "/var/www/cobbler"

StartResponse = Callable[..., Any]


def _xmlrpc_port() -> int:
    with open("/etc/cobbler/settings.yaml", encoding="utf-8") as fh:
        return int(yaml.safe_load(fh).get("xmlrpc_port", 25151))


def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path.startswith("/cblr/svc/"):
        import services  # the stock svc module, found via sys.path (see main)

        environ["REQUEST_URI"] = path  # mod_wsgi sets it, wsgiref does not
        result: Iterable[bytes] = services.application(environ, start)
        return result
    if path == "/cobbler_api":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        request = urllib.request.Request(
            f"http://127.0.0.1:{_xmlrpc_port()}/", data=body, headers={"Content-Type": "text/xml"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            data = response.read()
        start("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(data)))])
        return [data]
    if path.startswith("/cobbler/"):
        rel = os.path.normpath(path[len("/cobbler/") :])
        full = os.path.join(WWW_DIR, rel)
        if not rel.startswith("..") and os.path.isfile(full):
            kind = mimetypes.guess_type(full)[0] or "application/octet-stream"
            with open(full, "rb") as fh:
                data = fh.read()
            start("200 OK", [("Content-Type", kind), ("Content-Length", str(len(data)))])
            return [data]
    start("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not found\n"]


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    # A slow autoinstall render must not block nopxe calls from other installers.
    daemon_threads = True


class LoggingHandler(WSGIRequestHandler):
    """Apache's combined log's last field too: who fetched (an installer's wget, a script's
    curl, the simulator's Python)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        agent = self.headers.get("User-Agent", "-")
        self.log_message('"%s" %s %s "%s"', self.requestline, str(code), str(size), agent)


def main() -> None:
    sys.path.insert(0, SVC_DIR)
    port = int(sys.argv[1])
    with make_server("127.0.0.1", port, app, server_class=ThreadingWSGIServer,
                     handler_class=LoggingHandler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
