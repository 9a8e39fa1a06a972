"""Who may talk to the lab's Prefect API, and how: a random basic-auth string per lab (Prefect's
PREFECT_SERVER_API_AUTH_STRING) and TLS with a CA the lab makes (its server certificate for
127.0.0.1 only). Every client of the lab (its worker, `prefect deploy`, the CLI, the Salt
forwarder engine, tests and benches) gets the API through `PrefectAccess`, never by hand.

Files (in the lab's state dir; private ones created 0600 from the start, never logged):
  prefect-auth              user:password, the server's and every client's credential
  prefect-tls/ca.pem        the lab CA (clients verify the server with it)
  prefect-tls/ca.key        its key (signs the server certificate)
  prefect-tls/server.pem    the server certificate, then the CA (the chain uvicorn serves)
  prefect-tls/server.key
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import hashlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

import requests

from lab.state import LabInfo

AUTH_USER = "lab"
# the server certificate is made anew this long before it expires (a lab state dir lives on)
RENEW_BEFORE = datetime.timedelta(days=30)


def write_private(path: Path, data: bytes) -> None:
    """`data` into `path`, mode 0600 from the first byte (a temp file opened with the mode,
    then renamed over)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def read_auth_string(path: Path) -> str:
    """The `user:password` of an auth file, which only its owner may read (the CLI's check)."""
    from store_rollout.settings_outside import prefect_auth_string

    return prefect_auth_string(path)


def ensure_auth_file(path: Path) -> Path:
    """The lab's auth string, made once per state dir (random, never a default)."""
    if not path.exists():
        write_private(path, f"{AUTH_USER}:{secrets.token_urlsafe(24)}\n".encode())
    return path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    ca_key: Path
    chain: Path
    key: Path

    @classmethod
    def at(cls, directory: Path) -> TlsFiles:
        return cls(directory / "ca.pem", directory / "ca.key", directory / "server.pem",
                   directory / "server.key")


def ensure_tls(directory: Path) -> TlsFiles:
    """The lab CA (made once) and a server certificate for 127.0.0.1 it signed (made again when
    it is missing, about to expire, or not the CA's)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = TlsFiles.at(directory)
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM
    private = (serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    if not (files.ca.exists() and files.ca_key.exists()):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "store-rollout lab CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(
                       digital_signature=False, content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                                  critical=False)
                   .sign(ca_key, hashes.SHA256()))
        write_private(files.ca_key, ca_key.private_bytes(pem, *private))
        files.ca.write_bytes(ca_cert.public_bytes(pem))
        files.chain.unlink(missing_ok=True)
    ca_cert = x509.load_pem_x509_certificate(files.ca.read_bytes())
    if files.chain.exists() and files.key.exists():
        leaf = x509.load_pem_x509_certificate(files.chain.read_bytes())
        if leaf.issuer == ca_cert.subject and leaf.not_valid_after_utc - RENEW_BEFORE > now:
            return files
    loaded = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=397))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                loaded.public_key()), critical=False)
            .sign(loaded, hashes.SHA256()))
    write_private(files.key, key.private_bytes(pem, *private))
    # the CA after the leaf: a browser that trusts the CA by its key's hash sees it in the chain
    files.chain.write_bytes(leaf.public_bytes(pem) + ca_cert.public_bytes(pem))
    return files


def spki_sha256(cert_file: Path) -> str:
    """Base64 SHA-256 of a certificate's public key (Chromium's
    --ignore-certificate-errors-spki-list trusts a chain holding that key, and nothing else)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@dataclass(frozen=True)
class PrefectAccess:
    """The lab's Prefect API as a client reaches it: URL, CA bundle, credential file."""

    api_url: str
    ca_file: Path
    auth_file: Path

    @classmethod
    def of(cls, info: LabInfo) -> PrefectAccess:
        """The access a lab's lab.json describes."""
        if not (info.prefect_auth_file and info.prefect_ca_file):
            raise RuntimeError(f"{info.state_dir}/lab.json: written before the Prefect API had "
                               "TLS and auth; run `store-rollout lab down` and `lab up`")
        return cls(info.prefect_api_url, Path(info.prefect_ca_file), Path(info.prefect_auth_file))

    def __post_init__(self) -> None:
        _KNOWN[self.api_url.rstrip("/")] = self  # api_session(url) finds it

    @property
    def auth_string(self) -> str:
        return read_auth_string(self.auth_file)

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    def session(self) -> requests.Session:
        """A requests session that authenticates and verifies the server with the lab CA."""
        return _session(self.auth_file, self.ca_file)

    def env(self) -> dict[str, str]:
        """What a Prefect client process needs (worker, `prefect deploy`, the CLI)."""
        return {"PREFECT_API_URL": self.api_url, "PREFECT_API_AUTH_STRING": self.auth_string,
                "PREFECT_API_SSL_CERT_FILE": str(self.ca_file)}

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        """This process's Prefect client on the lab's server, for the block's duration."""
        from prefect.settings import (
            PREFECT_API_AUTH_STRING,
            PREFECT_API_SSL_CERT_FILE,
            PREFECT_API_URL,
            temporary_settings,
        )

        with temporary_settings(updates={PREFECT_API_URL: self.api_url,
                                         PREFECT_API_AUTH_STRING: self.auth_string,
                                         PREFECT_API_SSL_CERT_FILE: str(self.ca_file)}):
            yield


# every lab API this process has described, by URL (a lab's up, lab.json read)
_KNOWN: dict[str, PrefectAccess] = {}


def api_session(lab: LabInfo | str) -> requests.Session:
    """A session on a lab's API, logged in and verifying TLS with that lab's CA: of the lab
    `lab` describes, or of a lab API this process knows by its URL (helpers handed a URL)."""
    if isinstance(lab, LabInfo):
        return PrefectAccess.of(lab).session()
    access = _KNOWN.get(lab.rstrip("/"))
    if access is None:
        raise LookupError(f"{lab}: no lab Prefect API known in this process; describe it "
                          "first (PrefectAccess.of(load_lab_info()))")
    return access.session()


@functools.cache
def _session(auth_file: Path, ca_file: Path) -> requests.Session:
    session = requests.Session()
    user, password = read_auth_string(auth_file).split(":", 1)
    session.auth = (user, password)
    session.verify = str(ca_file)
    session.trust_env = False  # no proxy or netrc of the environment between us and the lab
    return session
