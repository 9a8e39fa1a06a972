"""The hypervisor's libvirt TLS files (storevirt.tls_request, tls_install, tls_status), a Salt
utils module: __utils__["store_libvirt_tls.*"] in execution modules, synced from salt://_utils.

The host's key is made here once, with the host's `openssl`, and never leaves it: the master's
CA (tasks/libvirt_tls.py) signs a CSR for it, and the certificate comes back with the CA's
certificate. The files are where libvirt reads them by default under `pki_dir` (/etc/pki on a
real host), the server's and the client's (a peer-to-peer migration presents the client
certificate to the other box's libvirtd), plus a client "pkipath" dir for connections the host
minion itself opens to another box (storevirt.send_disks).

Python 3.6 and Salt 3006.0 (a SLES 15 SP7 store host) as well as Salt 3008.
"""

import calendar
import os
import re
import socket
import subprocess
import tempfile
import time

from salt.exceptions import CommandExecutionError

SERVER_KEY = "libvirt/private/serverkey.pem"
CLIENT_KEY = "libvirt/private/clientkey.pem"
SERVER_CERT = "libvirt/servercert.pem"
CLIENT_CERT = "libvirt/clientcert.pem"
CA_CERT = "CA/cacert.pem"
CLIENT_DIR = "libvirt/client"  # a libvirt client's pkipath: cacert, clientcert, clientkey
QEMU_DIR = "qemu"  # QEMU's TLS files (qemu.conf default_tls_x509_cert_dir = <pki>/qemu)
TLS_ORG = "store-rollout"  # contracts.LIBVIRT_TLS_ORG

# capture_output= and text= are Python 3.7: a SLES 15 SP7 minion runs 3.6 (store-stack.md)
_CAPTURE_TEXT = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "universal_newlines": True}


def _openssl(argv, what, stdin=None):
    proc = subprocess.run(["openssl"] + argv, input=stdin, check=False, **_CAPTURE_TEXT)
    if proc.returncode != 0:
        raise CommandExecutionError("{}: openssl {} exited {}: {}".format(
            what, argv[0], proc.returncode, proc.stderr.strip()[-400:]))
    return proc.stdout


def _write(path, text, mode):
    """Atomic, with its mode from the start (a key is never readable by others, not even
    for a moment)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700 if "private" in directory else 0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tls-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def ensure_key(pki_dir):
    """The host's key (RSA 2048, 0600), made once; an existing one is kept."""
    key = os.path.join(pki_dir, SERVER_KEY)
    if not os.path.exists(key):
        pem = _openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                       "the host's libvirt key")
        _write(key, pem, 0o600)
    return key


def address_toward(master):
    """The source address of this host's route to `master` (a UDP socket's connect sends
    nothing: the kernel only picks the route)."""
    family = socket.AF_INET6 if ":" in master else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_DGRAM)
    try:
        probe.connect((master, 4506))
        return probe.getsockname()[0]
    finally:
        probe.close()


def request(pki_dir, minion_id, address):
    """A CSR for the host's key, subject O=store-rollout, CN=<minion id>."""
    key = ensure_key(pki_dir)
    csr = _openssl(["req", "-new", "-key", key, "-subj", "/O={}/CN={}".format(TLS_ORG, minion_id)],
                   "the host's libvirt CSR")
    return {"csr": csr, "address": address}


def _public_key(argv, text, what):
    return _openssl(argv, what, stdin=text).strip()


def install(pki_dir, ca_pem, cert_pem):
    """Check `cert_pem` is for this host's key and signed by `ca_pem`, then write the server's,
    the client's and the pkipath dir's files. Returns whether anything changed."""
    key = os.path.join(pki_dir, SERVER_KEY)
    key_pem = _read(key)
    if key_pem is None:
        raise CommandExecutionError("tls_install: this host has no libvirt key ({}); ask for a "
                                    "certificate with storevirt.tls_request first".format(key))
    mine = _public_key(["pkey", "-pubout"], key_pem, "tls_install: the host's key")
    theirs = _public_key(["x509", "-noout", "-pubkey"], cert_pem, "tls_install: the certificate")
    if mine != theirs:
        raise CommandExecutionError(
            "tls_install: the certificate is not for this host's key ({}); sign this host's "
            "own CSR (storevirt.tls_request)".format(key))
    with tempfile.TemporaryDirectory() as tmp:
        ca_file, cert_file = os.path.join(tmp, "ca.pem"), os.path.join(tmp, "cert.pem")
        for path, text in ((ca_file, ca_pem), (cert_file, cert_pem)):
            with open(path, "w") as handle:
                handle.write(text)
        _openssl(["verify", "-CAfile", ca_file, cert_file],
                 "tls_install: the certificate is not signed by the CA given")
    wanted = {
        CA_CERT: (ca_pem, 0o644), SERVER_CERT: (cert_pem, 0o644), CLIENT_CERT: (cert_pem, 0o644),
        CLIENT_KEY: (key_pem, 0o600),
        CLIENT_DIR + "/cacert.pem": (ca_pem, 0o644),
        CLIENT_DIR + "/clientcert.pem": (cert_pem, 0o644),
        CLIENT_DIR + "/clientkey.pem": (key_pem, 0o600),
        # QEMU's own TLS for a live migration's memory and disk streams (VIR_MIGRATE_TLS), in
        # qemu.conf's default_tls_x509_cert_dir (<pki>/qemu): the same key and certificate
        QEMU_DIR + "/ca-cert.pem": (ca_pem, 0o644),
        QEMU_DIR + "/server-cert.pem": (cert_pem, 0o644),
        QEMU_DIR + "/server-key.pem": (key_pem, 0o600),
        QEMU_DIR + "/client-cert.pem": (cert_pem, 0o644),
        QEMU_DIR + "/client-key.pem": (key_pem, 0o600),
    }
    changed = False
    for relpath, (text, mode) in sorted(wanted.items()):
        path = os.path.join(pki_dir, relpath)
        if _read(path) != text:
            _write(path, text, mode)
            changed = True
    return changed


def reload(argv):
    """Have the running libvirtd reread its TLS files (`tls_reload`)."""
    proc = subprocess.run(list(argv), check=False, **_CAPTURE_TEXT)
    if proc.returncode != 0:
        raise CommandExecutionError(
            "tls_install: the certificate is installed but `{}` exited {}: {} (minion config "
            "storevirt:tls_reload)".format(" ".join(argv), proc.returncode,
                                           proc.stderr.strip()[-300:]))


def _not_after(text):
    stamp = text.strip().split("=", 1)[1].strip()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(
        calendar.timegm(time.strptime(stamp, "%b %d %H:%M:%S %Y GMT"))))


def fingerprint(cert_pem):
    """sha256 of the certificate's DER encoding (hex): how the orchestrator names its CA."""
    out = _openssl(["x509", "-noout", "-fingerprint", "-sha256"], "a CA fingerprint",
                   stdin=cert_pem)
    return out.strip().split("=", 1)[1].replace(":", "").lower()


def status(pki_dir):
    """The server certificate's CN, SANs, end (UTC ISO 8601) and its CA's fingerprint, and
    whether the CA there verifies it; None when the host has no certificate."""
    cert_pem = _read(os.path.join(pki_dir, SERVER_CERT))
    ca_pem = _read(os.path.join(pki_dir, CA_CERT))
    if not cert_pem:
        return None
    subject = _openssl(["x509", "-noout", "-subject", "-nameopt", "RFC2253"],
                       "tls_status", stdin=cert_pem)
    cn = re.search(r"(?:^|,)CN=([^,]+)", subject.strip().split("=", 1)[1])
    ext = _openssl(["x509", "-noout", "-ext", "subjectAltName"], "tls_status", stdin=cert_pem)
    san = re.findall(r"(?:IP Address|DNS):([^,\s]+)", ext)
    end = _openssl(["x509", "-noout", "-enddate"], "tls_status", stdin=cert_pem)
    verified = False
    if ca_pem:
        proc = subprocess.run(
            ["openssl", "verify", "-CAfile", os.path.join(pki_dir, CA_CERT),
             os.path.join(pki_dir, SERVER_CERT)], check=False, **_CAPTURE_TEXT)
        verified = proc.returncode == 0
    return {"subject_cn": cn.group(1) if cn else None, "san": san, "not_after": _not_after(end),
            "ca_sha256": fingerprint(ca_pem) if ca_pem else None, "verified": verified}
