"""Issue 44: no secret in clear on a wire or in a file, and what Cobbler keeps of an install
(unit tests; the real Cobbler's side is tests/lab/test_lab_cobbler.py, a rollout's
tests/lab/test_rollout_e2e.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from store_rollout.contracts import MASTER_FINGER_META, MASTER_HASH_TYPE_META, TOKEN_MAP_FILE
from store_rollout.inventory import parse_inventory
from store_rollout.private_files import open_private, write_private
from store_rollout.settings import RolloutSettings, SettingsError, load_settings
from store_rollout.transport import url_problem
from tasks.bmc import BmcCredentials, RedfishBmc
from tasks.cobbler import CobblerClient
from tasks.erp import ErpClient
from tasks.salt import SaltError
from tasks.salt.master_key import master_pin
from tasks.salt.tokens import AutosignTokens
from tasks.transport import outside_url
from tests.helpers import BASE_ENV


def _write_master_pub(pki: Path) -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "master.pub").write_bytes(pem)
    return pem


@pytest.mark.parametrize("hash_type", ["sha256", "sha512"])
def test_master_pin_is_salt_key_f_master_in_the_masters_hash_type(tmp_path: Path,
                                                                  hash_type: str) -> None:
    pem = _write_master_pub(tmp_path / "pki")
    # what `salt-key -F master` prints: the hash of the PEM body (no BEGIN/END lines), the hex
    # digits in colon-separated pairs
    body = b"".join(pem.splitlines(keepends=True)[1:-1])
    digest = hashlib.new(hash_type, body).hexdigest()
    expected = ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
    pin = master_pin({"pki_dir": str(tmp_path / "pki"), "hash_type": hash_type})
    assert pin == {MASTER_FINGER_META: expected, MASTER_HASH_TYPE_META: hash_type}


def test_no_master_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(SaltError, match=r"public key .*master\.pub is missing: start the master"):
        master_pin({"pki_dir": str(tmp_path)})


# -- https:// for Cobbler, the ERP and Redfish, except on the loopback ------------------------
def _settings(**env: str) -> RolloutSettings:
    return load_settings({**BASE_ENV, **env})


@pytest.mark.parametrize("url", ["http://127.0.0.1:25151/", "http://127.3.4.5/", "http://[::1]:80/",
                                 "http://localhost:8/", "https://cobbler.example/cobbler_api"])
def test_https_or_the_loopback_is_accepted(url: str) -> None:
    assert url_problem(url, "cobbler", "cobbler_url", insecure=False) is None
    assert _settings(STORE_ROLLOUT_COBBLER_URL=url).cobbler_url == url


@pytest.mark.parametrize(("variable", "system"), [("STORE_ROLLOUT_COBBLER_URL", "cobbler"),
                                                  ("STORE_ROLLOUT_ERP_URL", "erp")])
def test_plain_http_off_the_loopback_is_refused_naming_the_field_and_the_fix(
        variable: str, system: str) -> None:
    with pytest.raises(SettingsError) as err:
        _settings(**{variable: "http://10.0.0.5/api"})
    brief = err.value.brief
    assert "\n" not in brief and variable in brief
    assert f"use https://, or set STORE_ROLLOUT_INSECURE_{system.upper()}_HTTP=true" in brief
    with pytest.raises(SettingsError, match=f"{variable}: 'ftp://x/' is not an https:// URL"):
        _settings(**{variable: "ftp://x/"})
    # the clients refuse it as well, whoever builds them (a Block's URL is not a setting)
    with pytest.raises(ValueError, match="would send .* in clear"):
        if system == "cobbler":
            CobblerClient(url="http://10.0.0.5/api", user="u", password="p")
        else:
            ErpClient(base_url="http://10.0.0.5/api", token=SecretStr("t"))
    with pytest.raises(ValueError, match="hypervisor.power_address: .* in clear"):
        RedfishBmc("http://10.0.0.5", "u", SecretStr("p"), store_id="0042")


def test_the_insecure_setting_lets_http_through_and_is_logged_each_time(
        caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(STORE_ROLLOUT_COBBLER_URL="http://10.0.0.5/api",
                         STORE_ROLLOUT_INSECURE_COBBLER_HTTP="true")
    assert settings.insecure_cobbler_http and not settings.insecure_erp_http
    with caplog.at_level(logging.WARNING, "store_rollout.transport"):
        for _ in range(2):
            outside_url(settings.cobbler_url, "cobbler", "STORE_ROLLOUT_COBBLER_URL",
                        settings.insecure_cobbler_http)
    warned = [r.getMessage() for r in caplog.records if "plain HTTP" in r.getMessage()]
    assert len(warned) == 2 and "STORE_ROLLOUT_INSECURE_COBBLER_HTTP=true" in warned[0]
    client = CobblerClient(url="http://10.0.0.5/api", user="u", password="p", insecure_http=True)
    assert client.url == "http://10.0.0.5/api"
    caplog.clear()
    with caplog.at_level(logging.WARNING, "store_rollout.transport"):  # https: nothing to say
        outside_url("https://cobbler.example/", "cobbler", "x", True)
    assert not caplog.records
    with pytest.raises(SettingsError, match="insecure_cobbler_http"):  # a bad value: named
        _settings(STORE_ROLLOUT_INSECURE_COBBLER_HTTP="perhaps")


def test_a_redfish_ca_bundle_verifies_the_bmc(tmp_path: Path) -> None:
    bundle = tmp_path / "bmc-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = _settings(STORE_ROLLOUT_REDFISH_CA_BUNDLE=str(bundle))
    store = parse_inventory({"stores": [{
        "store_id": "0042", "hypervisor": {"hostname": "hv.invalid", "mac": "52:54:00:42:00:01",
                                           "power_address": "bmc.invalid"},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "DE-0042"}}]}).stores[0]
    block = BmcCredentials(username="u", password=SecretStr("p"))
    client = block.get_client(store, "redfish", False, settings.redfish_ca_bundle)
    assert isinstance(client, RedfishBmc) and client.verify == str(bundle)
    assert BmcCredentials(username="u", password=SecretStr("p"), verify_tls=False).get_client(
        store, "redfish", False, str(bundle)).verify is False  # type: ignore[attr-defined]
    with pytest.raises(SettingsError, match="redfish_ca_bundle: .*no such file"):
        _settings(STORE_ROLLOUT_REDFISH_CA_BUNDLE=str(tmp_path / "none.pem"))


# -- secrets from Blocks only ------------------------------------------------------------------
SECRET = "s3cret-not-to-be-echoed"


@pytest.mark.parametrize(("variable", "block", "setting"), [
    ("STORE_ROLLOUT_COBBLER_PASSWORD", "a Cobbler Credentials Block",
     "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK"),
    ("STORE_ROLLOUT_ERP_TOKEN", "an ERP Credentials Block", "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK")])
def test_a_secret_in_the_environment_or_the_settings_file_is_refused(
        tmp_path: Path, variable: str, block: str, setting: str) -> None:
    with pytest.raises(SettingsError) as err:
        _settings(**{variable: SECRET})
    message = str(err.value)
    assert "\n" not in message and SECRET not in message
    assert message.startswith(f"{variable} (in the environment): ")
    assert f"save it in {block} and set {setting} to the block name" in message
    path = tmp_path / "settings.env"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, f"{variable}='{SECRET}'\n".encode())
    os.close(fd)
    with pytest.raises(SettingsError, match=f"^{variable} \\(in {path}\\): secrets are not read"):
        load_settings({**BASE_ENV, "STORE_ROLLOUT_SETTINGS_FILE": str(path)})


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_settings_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "settings.env"
    path.write_text("STORE_ROLLOUT_REGION=default\n")
    path.chmod(mode)
    with pytest.raises(SettingsError) as err:
        load_settings({**BASE_ENV, "STORE_ROLLOUT_SETTINGS_FILE": str(path)})
    assert str(err.value) == (f"{path}: the settings file is readable by others (mode "
                              f"{mode:03o}): run `chmod 600 {path}`")
    path.chmod(0o600)
    assert load_settings({**BASE_ENV, "STORE_ROLLOUT_SETTINGS_FILE": str(path)}).region == "default"


# -- files 0600 from their creation ------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_files_are_0600_at_their_creation(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, int] = {}
    target = tmp_path / "secret.json"
    # a leftover temporary file others could read is not reused
    stale = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    stale.write_text("old")
    stale.chmod(0o644)
    write_private(target, "{}", before_replace=lambda tmp: seen.setdefault("tmp", _mode(tmp)))
    assert seen == {"tmp": 0o600} and _mode(target) == 0o600 and target.read_text() == "{}"
    # os.open is given the mode: no chmod anywhere (a chmod would come after the creation)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod after the write"))
    monkeypatch.setattr(Path, "chmod", lambda *a, **k: pytest.fail("chmod after the write"))
    os.umask(0o000)  # even with no umask, nothing is wider than 0600
    try:
        write_private(tmp_path / "again", "x")
        os.close(open_private(tmp_path / "lock"))
    finally:
        os.umask(0o022)
    assert _mode(tmp_path / "again") == 0o600 and _mode(tmp_path / "lock") == 0o600


def test_token_files_and_their_lock_are_0600_from_their_creation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    tokens = AutosignTokens(tmp_path / "autosign_grains", user, "/dev/null")
    created: list[tuple[str, int]] = []
    real_open = os.open

    def watching_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = real_open(path, flags, mode, **kw)
        if flags & os.O_CREAT:
            created.append((Path(path).name, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(os, "open", watching_open)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod after the write"))
    token = tokens.issue("store-0042-hv")
    assert token in tokens.all()
    names = {name for name, _ in created}
    assert {"store_rollout_token.lock"} <= names and any(".tmp" in n for n in names), created
    assert all(mode == 0o600 for _, mode in created), created
    for path in (tokens.autosign_file, tokens.autosign_file.with_suffix(".lock"),
                 tmp_path / TOKEN_MAP_FILE):
        assert _mode(path) == 0o600, path


def test_the_lab_writes_its_settings_file_0600(tmp_path: Path) -> None:
    from tests.unit.store_rollout.test_settings import lab_settings

    path = lab_settings(tmp_path / "lab")
    assert _mode(path) == 0o600 and _mode(path.with_name("lab.json")) == 0o600
    text = path.read_text()
    # the lab's secrets are Blocks it names, never values in the file
    assert "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK='lab-cobbler-password'" in text
    assert "STORE_ROLLOUT_ERP_TOKEN_BLOCK='lab-erp-token'" in text
    assert "STORE_ROLLOUT_COBBLER_PASSWORD=" not in text and "STORE_ROLLOUT_ERP_TOKEN=" not in text


def test_cobbler_and_the_erp_verify_https_against_their_ca_bundles(tmp_path: Path) -> None:
    import ssl
    import subprocess
    import xmlrpc.client

    key, cert = tmp_path / "ca.key", tmp_path / "ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=test CA", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    cobbler = CobblerClient(url="https://cobbler.example/cobbler_api", user="u", password="p",
                            ca_bundle=str(cert))
    transport = cobbler._proxy._ServerProxy__transport
    # https goes over TLS (a plain-HTTP transport would send the login in clear), verified
    assert isinstance(transport, xmlrpc.client.SafeTransport)
    assert transport.context.verify_mode == ssl.CERT_REQUIRED
    assert any(c["subject"] == ((("commonName", "test CA"),),)
               for c in transport.context.get_ca_certs())
    erp = ErpClient(base_url="https://erp.example/", token=SecretStr("t"), ca_bundle=str(cert))
    assert erp.session.verify == str(cert)
    assert ErpClient(base_url="https://erp.example/", token=SecretStr("t")).session.verify is True
