"""Issue 44: the Prefect API's credential and TLS as its clients get them, without a lab (the lab's
own server refusing anyone without the credential: tests/lab/test_lab.py
::test_prefect_api_refuses_anyone_without_the_lab_credential).

The Salt forwarder engine posts to a real HTTPS server with the lab's certificates here."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.prefect_access import ensure_auth_file, ensure_tls, write_private
from lab.state import SALT_STATES_DIR
from store_rollout.settings import SettingsError
from store_rollout.settings_outside import PREFECT_AUTH_FILE_ENV, prefect_settings_of_file
from tests.helpers import load_salt_module

FORWARDER = SALT_STATES_DIR / "_engines" / "store_prefect_events.py"


@pytest.fixture(scope="module")
def forwarder() -> Any:
    return load_salt_module("_engines", "store_prefect_events")


def test_lab_credential_and_keys_are_private_from_the_start(tmp_path: Path) -> None:
    auth = ensure_auth_file(tmp_path / "auth")
    user, password = auth.read_text().strip().split(":", 1)
    assert auth.stat().st_mode & 0o777 == 0o600 and user and len(password) >= 24
    assert ensure_auth_file(tmp_path / "auth").read_text() == auth.read_text()  # made once
    assert ensure_auth_file(tmp_path / "other").read_text() != auth.read_text()  # random
    tls = ensure_tls(tmp_path / "tls")
    assert tls.key.stat().st_mode & 0o777 == 0o600 and tls.ca_key.stat().st_mode & 0o777 == 0o600
    assert tls.chain.read_text().count("BEGIN CERTIFICATE") == 2  # leaf, then the CA
    assert ensure_tls(tmp_path / "tls").chain.read_bytes() == tls.chain.read_bytes()  # kept


def settings_with(tmp_path: Path, auth_mode: int) -> tuple[dict[str, str], Path]:
    auth = tmp_path / "prefect-auth"
    auth.unlink(missing_ok=True)
    write_private(auth, b"lab:s3cret\n")
    auth.chmod(auth_mode)
    settings = tmp_path / "settings.env"
    settings.write_text(f"PREFECT_API_URL='https://127.0.0.1:1/api'\n"
                        f"PREFECT_API_SSL_CERT_FILE='{tmp_path}/ca.pem'\n"
                        f"{PREFECT_AUTH_FILE_ENV}='{auth}'\n")
    return {"STORE_ROLLOUT_SETTINGS_FILE": str(settings)}, auth


def test_cli_gets_the_credential_from_the_file_the_settings_name(tmp_path: Path) -> None:
    env, auth = settings_with(tmp_path, 0o600)
    assert prefect_settings_of_file(env) == {
        "PREFECT_API_URL": "https://127.0.0.1:1/api",
        "PREFECT_API_SSL_CERT_FILE": f"{tmp_path}/ca.pem", "PREFECT_API_AUTH_STRING": "lab:s3cret"}
    # the environment's own credential wins; the file is not read
    assert "PREFECT_API_AUTH_STRING" not in prefect_settings_of_file(
        {**env, "PREFECT_API_AUTH_STRING": "lab:other"})
    env, auth = settings_with(tmp_path, 0o644)
    with pytest.raises(SettingsError, match=f"{PREFECT_AUTH_FILE_ENV}=.*chmod 600"):
        prefect_settings_of_file(env)
    auth.chmod(0o600)
    auth.write_text("no-colon\n")
    with pytest.raises(SettingsError, match="not a user:password line"):
        prefect_settings_of_file(env)


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.headers.get("Authorization"), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def https_api(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A throwaway HTTPS server with the lab's certificate on 127.0.0.1 (its URL, its CA)."""
    tls = ensure_tls(tmp_path / "tls")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tls.chain), str(tls.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.seen = []
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/api", tls.ca
    finally:
        server.shutdown()
        server.server_close()


def test_forwarder_sends_basic_auth_over_verified_tls(forwarder: Any, tmp_path: Path,
                                                      https_api: tuple[str, Path]) -> None:
    url, ca = https_api
    auth = ensure_auth_file(tmp_path / "auth")
    headers, context = forwarder._connection(url, str(auth), str(ca))
    forwarder._post(url, [{"event": "salt.store.probe"}], headers, context)
    path, sent, body = _Recorder.seen[-1]
    assert path == "/api/events" and body == [{"event": "salt.store.probe"}]
    assert sent == "Basic " + base64.b64encode(auth.read_text().strip().encode()).decode()
    # the system's trust store does not know the lab CA: verified, never skipped
    headers, context = forwarder._connection(url, str(auth), None)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        forwarder._post(url, [{"event": "x"}], headers, context)


def test_forwarder_refuses_an_open_credential_or_one_in_clear(forwarder: Any,
                                                              tmp_path: Path) -> None:
    auth = ensure_auth_file(tmp_path / "auth")
    with pytest.raises(forwarder.ForwarderConfigError, match="https://"):
        forwarder._connection("http://prefect.example:4200/api", str(auth))
    auth.chmod(0o644)
    with pytest.raises(forwarder.ForwarderConfigError, match="chmod 600"):
        forwarder._connection("https://prefect.example:4200/api", str(auth))
    with pytest.raises(forwarder.ForwarderConfigError, match="cannot read"):
        forwarder._connection("https://prefect.example/api", str(tmp_path / "missing"))
    # no credential configured: no header (an API without auth, as before)
    headers, _ = forwarder._connection("http://127.0.0.1:4200/api")
    assert "Authorization" not in headers
