"""The hypervisors' libvirt TLS trust (issue 48), as Salt Virt's `virt.keys` does it: a CA the
master keeps (settings `libvirt_ca_dir`, made on first use: dir 0700, key 0600) signs each
box's own key, whose CSR the box's minion makes (`storevirt.tls_request`); the certificate and
the CA's certificate go back through `storevirt.tls_install` (public, so job arguments). The
certificate names the box's hypervisor minion id (CN, O = LIBVIRT_TLS_ORG) and its address
(subjectAltName), for both ends of a connection (EKU server and client): a box's libvirtd lets
in only its store's boxes (LIBVIRT_TLS_ALLOWED_DNS, the hypervisor formula's
tls_allowed_dn_list), so no other store's box can push or pull its VM.

`issued.json` beside the CA records which minion holds each address: an address another box
holds is refused (a box cannot take over another's name in a URI).
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prefect import get_run_logger, task

from store_rollout.contracts import LIBVIRT_TLS_ORG, REFRESHED_HV_ID_RE
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from store_rollout.settings_refresh import RefreshPart
from tasks.retry import SALT_VIRT_RETRY
from tasks.salt import SaltTransientError, master_client

CA_KEY: Final = "ca.key"
CA_CERT: Final = "ca.pem"
ISSUED: Final = "issued.json"
RENEW_BEFORE: Final = datetime.timedelta(days=30)  # a certificate this close to its end is renewed


class LibvirtTlsRefused(ValueError):
    """The CA refused to sign (no CA dir set, a bad CSR, an address another box holds)."""


def ca_dir_of(refresh: RefreshPart) -> Path:
    if not refresh.libvirt_ca_dir:
        raise LibvirtTlsRefused("libvirt_ca_dir missing: set STORE_ROLLOUT_LIBVIRT_CA_DIR to a "
                                "directory on the master for the hypervisors' libvirt CA "
                                "(made on first use, mode 0700)")
    return Path(refresh.libvirt_ca_dir)


@contextmanager
def _locked(ca_dir: Path) -> Iterator[None]:
    ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_dir.chmod(0o700)
    with open(ca_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _make_ca(ca_dir: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, LIBVIRT_TLS_ORG),
                      x509.NameAttribute(NameOID.COMMON_NAME, "store-rollout libvirt CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write(ca_dir / CA_KEY, key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()), 0o600)
    _write(ca_dir / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def ca_pem(ca_dir: Path) -> str:
    """The CA's certificate (PEM), the CA made first when the dir has none."""
    with _locked(ca_dir):
        if not (ca_dir / CA_KEY).exists():
            _make_ca(ca_dir)
    return (ca_dir / CA_CERT).read_text()


def ca_sha256(ca_dir: Path) -> str:
    """sha256 of the CA certificate's DER (hex): what storevirt.tls_status reports as ca_sha256."""
    return x509.load_pem_x509_certificate(ca_pem(ca_dir).encode()).fingerprint(
        hashes.SHA256()).hex()


def _issued(ca_dir: Path) -> dict[str, str]:
    path = ca_dir / ISSUED
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _checked_csr(csr_pem: str, minion_id: str) -> x509.CertificateSigningRequest:
    if not re.fullmatch(REFRESHED_HV_ID_RE, minion_id):
        raise LibvirtTlsRefused(f"minion id {minion_id!r} is no store hypervisor's "
                                f"({REFRESHED_HV_ID_RE}); nothing signed")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
    except ValueError as exc:
        raise LibvirtTlsRefused(f"{minion_id}: its CSR does not parse ({exc}); nothing "
                                "signed") from None
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not csr.is_signature_valid or [n.value for n in names] != [minion_id]:
        raise LibvirtTlsRefused(f"{minion_id}: its CSR is not signed by its key or names "
                                f"another CN ({csr.subject.rfc4514_string()}); nothing signed")
    return csr


def sign(ca_dir: Path, csr_pem: str, minion_id: str, address: str, days: int) -> str:
    """A certificate (PEM) for the key of `csr_pem`: CN = `minion_id`, O = LIBVIRT_TLS_ORG,
    subjectAltName = IP `address`, EKU server and client, `days` long. LibvirtTlsRefused when
    another box holds `address`, the CSR is not its key's or names another CN."""
    csr = _checked_csr(csr_pem, minion_id)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise LibvirtTlsRefused(f"{minion_id}: address {address!r} is not an IP address; "
                                "nothing signed") from None
    ca_pem(ca_dir)
    with _locked(ca_dir):
        issued = _issued(ca_dir)
        holder = issued.get(str(ip))
        if holder not in (None, minion_id):
            raise LibvirtTlsRefused(f"{minion_id}: address {ip} is {holder}'s (a certificate "
                                    f"of this CA names it); retire {holder} first "
                                    "(forget_address); nothing signed")
        key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), None)
        ca = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        cert = _leaf(csr, ca, key, minion_id, ip, days)
        issued[str(ip)] = minion_id
        _write(ca_dir / ISSUED, json.dumps(issued, indent=1, sort_keys=True).encode(), 0o600)
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _leaf(csr: x509.CertificateSigningRequest, ca: x509.Certificate, key: Any, minion_id: str,
          ip: ipaddress.IPv4Address | ipaddress.IPv6Address, days: int) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, LIBVIRT_TLS_ORG),
                         x509.NameAttribute(NameOID.COMMON_NAME, minion_id)])
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
            .public_key(csr.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False,
                                         False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca.public_key()), critical=False)  # type: ignore[arg-type]
            .sign(key, hashes.SHA256()))


def forget_address(ca_dir: Path, minion_id: str) -> list[str]:
    """A retired box's addresses freed for another box; returns them."""
    with _locked(ca_dir):
        issued = _issued(ca_dir)
        freed = sorted(a for a, holder in issued.items() if holder == minion_id)
        for address in freed:
            del issued[address]
        _write(ca_dir / ISSUED, json.dumps(issued, indent=1, sort_keys=True).encode(), 0o600)
    return freed


def _same_addresses(san: Any, address: str) -> bool:
    """The certificate's SAN is exactly `address` (IPv6 compared as addresses: openssl prints
    them uncompressed and in capitals)."""
    try:
        return (isinstance(san, list) and len(san) == 1
                and ipaddress.ip_address(str(san[0])) == ipaddress.ip_address(address))
    except ValueError:
        return False


def trusted(status: dict[str, Any] | None, minion_id: str, address: str, ca_dir: Path,
            renew_before: datetime.timedelta = RENEW_BEFORE) -> bool:
    """Whether a box's tls_status is this CA's valid certificate for `minion_id` at `address`."""
    if not status or not status.get("verified"):
        return False
    ends = datetime.datetime.fromisoformat(str(status["not_after"]).replace("Z", "+00:00"))
    return (status.get("subject_cn") == minion_id and _same_addresses(status.get("san"), address)
            and status.get("ca_sha256") == ca_sha256(ca_dir)
            and ends - datetime.datetime.now(datetime.UTC) > renew_before)


@task(name="ensure_libvirt_tls", task_run_name="libvirt-tls-{box.hypervisor_minion_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def ensure_libvirt_tls(box: Store, salt: SaltSettings, refresh: RefreshPart) -> dict[str, Any]:
    """The box's libvirt certificate from the master's CA, for its own key and its address
    toward the master (tls_request -> sign -> tls_install); nothing when it has a valid one of
    this CA for that address already."""
    ca_dir = ca_dir_of(refresh)
    master = master_client(salt.salt_master_config)
    minion = box.hypervisor_minion_id
    request = master.cmd(minion, "storevirt.tls_request")
    if box.hypervisor.ip != "dhcp" and request["address"] != box.hypervisor.ip:
        # the box's word is taken only where the inventory has none: a static address is the
        # inventory's (a box claiming another's address would take it in issued.json)
        raise LibvirtTlsRefused(f"store {box.store_id}: {minion} says its address is "
                                f"{request['address']}, the inventory's hypervisor.ip is "
                                f"{box.hypervisor.ip}; nothing signed (fix the box's network "
                                "or the inventory)")
    status = master.cmd(minion, "storevirt.tls_status")
    issued = not trusted(status, minion, request["address"], ca_dir)
    if issued:
        cert = sign(ca_dir, request["csr"], minion, request["address"], refresh.libvirt_cert_days)
        master.cmd(minion, "storevirt.tls_install", [ca_pem(ca_dir), cert])
        status = master.cmd(minion, "storevirt.tls_status")
    get_run_logger().info("store %s: %s's libvirt certificate for %s %s, valid to %s",
                          box.store_id, minion, request["address"],
                          "issued" if issued else "kept", status["not_after"])
    return {"minion": minion, "address": request["address"], "not_after": status["not_after"],
            "issued": issued}
