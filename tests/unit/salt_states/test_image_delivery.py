"""Image delivery to a hypervisor (storevirt.ensure_base_image, whose work is the utils module
salt_states/_utils/store_image_download.py) over HTTP(S) from the lab's image server, which is
what any static server does in production: verified, resumable, atomic, TLS-checked, paced.
Runs the utils module and the server in-process; tests/unit/salt_states/test_host_python36.py calls
it through storevirt and Salt's loader."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from salt.exceptions import CommandExecutionError

from lab import image_server
from store_rollout.contracts import DOWNLOAD_CUT
from tasks.salt import SaltCommandFailed
from tests.helpers import load_salt_module

KEY = "k" * 16
SIZE = 2 * 1024 * 1024 + 12345


def delivery_to(images: Path) -> Callable[..., Any]:
    """storevirt.ensure_base_image as a hypervisor whose images dir is `images` runs it."""
    download = load_salt_module("_utils", "store_image_download")
    return functools.partial(download.ensure_base_image, str(images))


class Served:
    def __init__(self, root: Path, tls: ssl.SSLContext | None = None) -> None:
        self.server = image_server.serve(root, "127.0.0.1", 0, tls)
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, key: str = KEY) -> str:
        return f"{self.base}/{key}/image.qcow2"

    def lab(self, method: str, path: str, **kw: Any) -> Any:
        return requests.request(method, f"{self.base}{path}", timeout=10, verify=False,
                                **kw).json()

    def sent(self) -> int:
        return int(self.lab("GET", "/_lab/stats")["sent"].get(f"/{KEY}/image.qcow2", 0))


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, str]:
    entry = tmp_path / "cache" / KEY
    entry.mkdir(parents=True)
    data = os.urandom(SIZE)
    (entry / "image.qcow2").write_bytes(data)
    (entry / "meta.json").write_text(json.dumps({"key": KEY}))
    return tmp_path / "cache", hashlib.sha256(data).hexdigest()


@pytest.fixture
def served(cache: tuple[Path, str]) -> Iterator[Served]:
    srv = Served(cache[0])
    yield srv
    srv.server.shutdown()


def test_delivered_verified_then_never_again(served: Served, cache: tuple[Path, str],
                                            tmp_path: Path) -> None:
    deliver = delivery_to(tmp_path / "hv")
    first = deliver(served.url(), KEY, cache[1], meta={"key": KEY})
    dest = tmp_path / "hv" / "base" / KEY / "image.qcow2"
    assert first["path"] == str(dest) and first["transferred"] == SIZE
    assert dest.read_bytes() == (cache[0] / KEY / "image.qcow2").read_bytes()
    assert dest.stat().st_mode & 0o777 == 0o444
    assert json.loads((dest.parent / "meta.json").read_text()) == {"key": KEY}
    again = deliver(served.url(), KEY, cache[1])
    assert again["cached"] is True and again["transferred"] == 0
    assert served.sent() == SIZE  # the rerun asked the server for nothing


def test_cut_download_resumes_with_a_range_request(served: Served, cache: tuple[Path, str],
                                                   tmp_path: Path) -> None:
    deliver = delivery_to(tmp_path / "hv")
    served.lab("POST", "/_lab/faults", json={"cut_after": SIZE // 2})
    with pytest.raises(CommandExecutionError, match=DOWNLOAD_CUT):
        deliver(served.url(), KEY, cache[1])
    part = tmp_path / "hv" / "base" / KEY / "image.qcow2.part"
    assert part.stat().st_size == SIZE // 2
    assert not part.with_suffix("").exists()  # never a partial base under its final name
    served.lab("DELETE", "/_lab/stats")
    resumed = deliver(served.url(), KEY, cache[1])
    assert resumed["resumed_from"] == SIZE // 2 and resumed["transferred"] == SIZE - SIZE // 2
    assert served.sent() <= 0.55 * SIZE
    stats = served.lab("GET", "/_lab/stats")
    assert stats["requests"] == [{"path": f"/{KEY}/image.qcow2",
                                  "range": f"bytes={SIZE // 2}-", "status": 206}]
    assert hashlib.sha256(Path(resumed["path"]).read_bytes()).hexdigest() == cache[1]


def test_corrupted_transfer_is_refused_and_removed(served: Served, cache: tuple[Path, str],
                                                   tmp_path: Path) -> None:
    deliver = delivery_to(tmp_path / "hv")
    served.lab("POST", "/_lab/faults", json={"flip_byte_at": 4096})
    with pytest.raises(CommandExecutionError) as err:
        deliver(served.url(), KEY, cache[1])
    message = str(err.value)
    assert f"image {KEY}: sha256 mismatch for {served.url()}: expected {cache[1]}, got " in message
    assert "the download was removed" in message
    assert [p.name for p in (tmp_path / "hv" / "base" / KEY).iterdir()] == [".download.lock"]
    fixed = deliver(served.url(), KEY, cache[1])  # a clean transfer
    assert fixed["transferred"] == SIZE


def test_concurrent_calls_download_once(served: Served, cache: tuple[Path, str],
                                        tmp_path: Path) -> None:
    """Two VMs of one image on one host (or a rerun beside a running call): one transfer, the
    other call waits for it and finds the verified image (they shared the .part file before)."""
    deliver = delivery_to(tmp_path / "hv")
    with ThreadPoolExecutor(max_workers=2) as pool:
        calls = [pool.submit(deliver, served.url(), KEY, cache[1],
                             rate_limit=8 * 1024 * 1024) for _ in range(2)]
        results = sorted((call.result() for call in calls), key=lambda r: r["transferred"])
    assert [r["cached"] for r in results] == [True, False], results
    assert [r["transferred"] for r in results] == [0, SIZE], results
    assert served.sent() == SIZE
    assert hashlib.sha256(Path(results[1]["path"]).read_bytes()).hexdigest() == cache[1]


def test_range_answers_206_and_bad_range_416(served: Served) -> None:
    got = requests.get(served.url(), headers={"Range": "bytes=10-19"}, timeout=10)
    assert got.status_code == 206 and len(got.content) == 10
    assert got.headers["Content-Range"] == f"bytes 10-19/{SIZE}"
    assert requests.get(served.url(), headers={"Range": f"bytes={SIZE}-"},
                        timeout=10).status_code == 416


def test_rate_limit_paces_the_transfer(served: Served, cache: tuple[Path, str],
                                       tmp_path: Path) -> None:
    deliver = delivery_to(tmp_path / "hv")
    rate = 4 * 1024 * 1024
    result = deliver(served.url(), KEY, cache[1], rate_limit=rate)
    assert result["seconds"] >= 0.95 * SIZE / rate  # never faster than allowed


def test_only_http_urls_from_the_image_server(cache: tuple[Path, str], tmp_path: Path) -> None:
    deliver = delivery_to(tmp_path / "hv")
    orchestrator_path = f"file://{cache[0] / KEY / 'image.qcow2'}"
    with pytest.raises(CommandExecutionError, match="not an http.s. URL.*image_base_url"):
        deliver(orchestrator_path, KEY, cache[1])


def _self_signed(tmp: Path) -> tuple[ssl.SSLContext, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab-images")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (tmp / "cert.pem").write_text(pem)
    (tmp / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return context, pem


def test_tls_is_verified_never_skipped(cache: tuple[Path, str], tmp_path: Path) -> None:
    context, ca_pem = _self_signed(tmp_path)
    srv = Served(cache[0], tls=context)
    try:
        deliver = delivery_to(tmp_path / "hv")
        with pytest.raises(CommandExecutionError, match="CERTIFICATE_VERIFY_FAILED"):
            deliver(srv.url(), KEY, cache[1])
        assert deliver(srv.url(), KEY, cache[1],
                                           ca_pem=ca_pem)["transferred"] == SIZE
    finally:
        srv.server.shutdown()


class CuttingMaster:
    """A Salt master whose hypervisor answers ensure_base_image with these failures first (the
    text Salt carries back from the minion), then the delivered image."""

    def __init__(self, *failures: str) -> None:
        self.failures = list(failures)
        self.calls = 0

    def cmd(self, minion_id: str, fun: str, args: list[Any], **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.failures:
            raise SaltCommandFailed(minion_id, fun, 1, self.failures.pop(0))
        return {"path": "/var/lib/store-rollout/base/k/image.qcow2", "transferred": 1}


def deliver(master: CuttingMaster, in_window: Any = lambda: None) -> dict[str, Any]:
    from store_rollout.inventory import parse_inventory
    from tasks.image_delivery import deliver_image

    store = parse_inventory({"stores": [{
        "store_id": "s1", "erp": {"site_code": "S1"},
        "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01"}}]}).get("s1")
    settings = SimpleNamespace(image_base_url="http://images", image_ca_bundle=None,
                               image_rate_limit=None)
    image = {"key": KEY, "sha256": "0" * 64, "meta": {}}
    return deliver_image(master, store, settings, image,  # type: ignore[arg-type]
                         in_window=in_window)


def test_a_cut_download_is_classified_once_and_resumed() -> None:
    from tasks.image_delivery import ImageDownloadCut, _cut_as_a_type

    cut = f"image {KEY}: {DOWNLOAD_CUT} from http://images at 1024 bytes (reset); the next attempt"
    master = CuttingMaster(cut)
    assert deliver(master)["transferred"] == 1 and master.calls == 2
    with pytest.raises(ImageDownloadCut, match=DOWNLOAD_CUT) as info, _cut_as_a_type():
        CuttingMaster(cut).cmd("store-s1-hv", "storevirt.ensure_base_image", [])
    assert info.value.minion_id == "store-s1-hv" and info.value.retcode == 1


def test_another_download_failure_is_not_retried() -> None:
    from tasks.image_delivery import ImageDownloadCut

    master = CuttingMaster(f"image {KEY}: sha256 mismatch")
    with pytest.raises(SaltCommandFailed, match="sha256 mismatch") as info:
        deliver(master)
    assert not isinstance(info.value, ImageDownloadCut) and master.calls == 1


def test_a_cut_download_resumes_only_inside_the_download_window() -> None:
    """The window is asked before each resume (it waits there for the next opening when the
    first closed meanwhile), not only by the caller before the first attempt."""
    cut = f"image {KEY}: {DOWNLOAD_CUT} from http://images at 1024 bytes (reset); the next attempt"
    master, asked = CuttingMaster(cut, cut), []
    assert deliver(master, in_window=lambda: asked.append(master.calls))["transferred"] == 1
    assert asked == [1, 2]  # before the second and third calls to the host
