"""The region's backup target in the lab (issue 48): Debian's rclone serving the restic REST
protocol (`rclone serve restic`) over TLS with a certificate of the lab CA (prefect-tls/ca.pem),
twice over one directory:

* the stores' endpoint, `127.0.0.1:<backup>`, which the store network's gateway forwards
  (a VM reaches it at https://10.77.0.1:<backup>): `--private-repos` (a user reaches only
  `/<user>/`), `--append-only` (a store cannot delete its backups), and an htpasswd file with a
  bcrypt line per store VM: user = the VM's minion id, password = derive(key, id,
  "rest-password") (store_rollout/backup_secrets.py). The lab adds a VM's line once the
  lab's Salt master has accepted the VM's key, i.e. before its first backup can come;
* the admin endpoint, `127.0.0.1:<backup_admin>`, on the orchestrator's loopback only (never
  forwarded): not append-only, its own htpasswd with the admin login the Backup Credentials
  Block holds (verification and retention).

Files under `<lab>/backup/`: `key` (0600, the Block's key; the master's ext_pillar reads it),
`admin-password` (0600), `data/` (the repositories), `tls/` (server cert and key), `htpasswd`,
`htpasswd-admin`.

Run (by `lab up`): python -m lab.backup_server <lab state dir> <port> <admin port>
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import secrets
import signal
import subprocess
import sys
import time
from ipaddress import IPv4Address
from pathlib import Path

from lab.prefect_access import PrefectAccess, TlsFiles, write_private
from lab.procs import ProcessRecord, spawn
from lab.store_network import GATEWAY
from store_rollout.backup_secrets import REST_PASSWORD, derive, is_store_vm

ADMIN_USER = "store-rollout-admin"
SYNC_SECONDS = 1.0  # how often accepted store VM keys are looked for
# bcrypt's cost in the lab's htpasswd files: rclone checks the hash on every request, and a
# restic backup makes dozens; the passwords are 256-bit HMACs, not guessable at any cost
BCRYPT_COST = 4


class BackupFiles:
    """The backup target's files in the lab's state dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.key, self.admin_password = root / "key", root / "admin-password"
        self.data, self.htpasswd, self.htpasswd_admin = (
            root / "data", root / "htpasswd", root / "htpasswd-admin")
        self.cert, self.cert_key = root / "tls" / "server.pem", root / "tls" / "server.key"

    @classmethod
    def of(cls, state_dir: Path) -> BackupFiles:
        return cls(state_dir / "backup")

    def ensure_secrets(self) -> tuple[str, str]:
        """(key, admin password), each made once (random) and kept 0600."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in (self.key, self.admin_password):
            if not path.exists():
                write_private(path, secrets.token_hex(32).encode())
        return self.key.read_text().strip(), self.admin_password.read_text().strip()


def bcrypt_hash(password: str) -> str:
    """An htpasswd bcrypt hash ($2b$) by the C library's crypt(3) (libxcrypt)."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", BCRYPT_COST, None, 0)
    hashed = lib.crypt(password.encode(), salt) if salt else None
    if not hashed or not hashed.startswith(b"$2b$"):
        raise RuntimeError("lab backup server: crypt(3) made no bcrypt hash (libxcrypt?)")
    return hashed.decode()


def write_htpasswd(path: Path, users: dict[str, str]) -> None:
    """`users` ({user: password}) as bcrypt lines, replacing the file at once (rclone rereads
    a changed htpasswd file)."""
    write_private(path, "".join(f"{user}:{bcrypt_hash(password)}\n"
                                for user, password in sorted(users.items())).encode())


def issue_certificate(ca: TlsFiles, cert: Path, key: Path,
                      addresses: tuple[str, ...] = ("127.0.0.1", GATEWAY)) -> None:
    """A server certificate of the lab CA for `addresses` (IP SANs), made when missing."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if cert.exists() and key.exists():
        return
    cert.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    own = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    built = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                         "lab backup server")]))
             .issuer_name(ca_cert.subject).public_key(own.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=397))
             .add_extension(x509.SubjectAlternativeName(
                 [x509.IPAddress(IPv4Address(a)) for a in addresses]), critical=False)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    write_private(key, own.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    cert.write_bytes(built.public_bytes(pem) + ca_cert.public_bytes(pem))


def rclone_argv(files: BackupFiles, port: int, *, stores: bool) -> list[str]:
    """`rclone serve restic` for the stores' endpoint (private, append-only) or the admin one."""
    return ["rclone", "serve", "restic", str(files.data), "--config", "/dev/null",
            "--addr", f"127.0.0.1:{port}", "--cert", str(files.cert), "--key",
            str(files.cert_key),
            "--htpasswd", str(files.htpasswd if stores else files.htpasswd_admin),
            *(["--private-repos", "--append-only"] if stores else [])]


def accepted_store_vms(master_pki: Path) -> set[str]:
    """The store VMs whose keys the lab's master accepted."""
    accepted = master_pki / "minions"
    return {p.name for p in accepted.iterdir() if is_store_vm(p.name)} if accepted.is_dir() \
        else set()


def serve(files: BackupFiles, ca: TlsFiles, port: int, admin_port: int,
          master_pki: Path) -> int:
    key, admin_password = files.ensure_secrets()
    files.data.mkdir(exist_ok=True)
    issue_certificate(ca, files.cert, files.cert_key)
    write_htpasswd(files.htpasswd_admin, {ADMIN_USER: admin_password})
    users: set[str] = set()
    write_htpasswd(files.htpasswd, {})
    children = [subprocess.Popen(rclone_argv(files, p, stores=s))
                for p, s in ((port, True), (admin_port, False))]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(child.poll() is None for child in children):
            wanted = accepted_store_vms(master_pki)
            if wanted != users:
                write_htpasswd(files.htpasswd, {vm: derive(key, vm, REST_PASSWORD)
                                                for vm in wanted})
                print(f"backup users: {', '.join(sorted(wanted)) or '-'}", flush=True)
                users = wanted
            time.sleep(SYNC_SECONDS)
        return 1
    finally:
        for child in children:
            child.terminate()


def save_backup_block(access: PrefectAccess, name: str, admin_url: str,
                      files: BackupFiles) -> None:
    """The Backup Credentials Block the flows read (as `lab up` saves `lab-bmc`)."""
    from pydantic import SecretStr

    from tasks.backup import BackupCredentials

    key, admin_password = files.ensure_secrets()
    with access.settings():
        BackupCredentials(key=SecretStr(key), admin_url=admin_url, admin_user=ADMIN_USER,
                          admin_password=SecretStr(admin_password)).save(name, overwrite=True)


def start(state_dir: Path, port: int, admin_port: int, log: Path) -> ProcessRecord:
    return spawn([sys.executable, "-m", "lab.backup_server", str(state_dir), str(port),
                  str(admin_port)], log,
                 cwd=Path(__file__).resolve().parent.parent)


def ext_pillar_config(state_dir: Path, url: str, ca_file: str) -> dict[str, str]:
    """The master's store_backup ext_pillar options: the key file, the stores' URL, the CA."""
    return {"key_file": str(BackupFiles.of(state_dir).key), "url": url, "ca_file": ca_file}


def main(argv: list[str] | None = None) -> None:
    """`python -m lab.backup_server <lab state dir> <stores' port> <admin port>`."""
    from lab.state import LabPaths

    state_dir, port, admin_port = argv or sys.argv[1:]
    paths = LabPaths(Path(state_dir))
    sys.exit(serve(BackupFiles.of(paths.root), TlsFiles.at(paths.prefect_tls), int(port),
                   int(admin_port), paths.salt / "root" / "master" / "pki"))


if __name__ == "__main__":
    main()
