"""A store box's own libvirtd (issue 48): what a real store host runs, where a test needs two boxes
that reach each other over libvirt's TLS transport (a refresh's migration).

The lab's shared libvirtd (lab/libvirt_service.py) cannot show a migration: libvirt refuses to
migrate a domain to the daemon it runs on. A box racked with its own libvirtd gets one like the
shared one (same private mount namespace recipe), plus:
- it runs in the box's network namespace and listens on TLS at the box's address
  (LIBVIRT_TLS_PORT), as `libvirtd --listen` with `listen_tls` on a SLES host does;
- /etc is an overlay inside its namespace, so the box's pki dir is bound at /etc/pki, the paths
  libvirt reads by default: the server's certificate and key, the CA, and the client certificate
  the daemon presents when it migrates to a peer (peer-to-peer), all as on a real host;
  `virt-admin server-update-tls` rereads them from there;
- its images dir is bound over the lab's common VM images path, so two boxes hold the same path
  with different files, as two hosts do;
- `tls_allowed_dn_list` lets in only the store's own boxes (contracts.LIBVIRT_TLS_ALLOWED_DNS);
- a distinct `host_uuid`, since libvirt refuses a migration to a host with its own UUID.

Until the master's CA signs the box's certificate (storevirt.tls_install), the box presents a
self-signed one made here with the box's own key: no peer trusts it, so nothing migrates before
the trust is set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

from lab import libvirt_service
from lab.procs import ProcessRecord, spawn
from store_rollout.contracts import LIBVIRT_TLS_ALLOWED_DNS, LIBVIRT_TLS_PORT

SERVER_KEY = Path("libvirt/private/serverkey.pem")
SERVER_CERT = Path("libvirt/servercert.pem")
CA_CERT = Path("CA/cacert.pem")


def uri(box_dir: Path) -> str:
    return libvirt_service.uri(box_dir)


def admin_uri(box_dir: Path) -> str:
    return f"libvirtd:///system?socket={box_dir}/sock/libvirt-admin-sock"


def reload_tls_argv(box_dir: Path) -> list[str]:
    """What storevirt's `tls_reload` runs on a lab box (`virt-admin server-update-tls`, as on a
    real host, on this box's admin socket)."""
    return ["virt-admin", "-c", admin_uri(box_dir), "server-update-tls", "libvirtd"]


def bootstrap_pki(pki_dir: Path, box_name: str) -> None:
    """The box's own key and a certificate for it from a throwaway CA (its key is not kept),
    unless the box has a key already (a certificate the master's CA signed stays as it is)."""
    key = pki_dir / SERVER_KEY
    if key.exists():
        return
    for sub in (key.parent, (pki_dir / CA_CERT).parent):
        sub.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        ca_key, ca_cert, ext = Path(tmp, "ca.key"), Path(tmp, "ca.pem"), Path(tmp, "leaf.ext")
        ext.write_text("basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=digitalSignature,keyEncipherment\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n")
        for argv in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-keyout",
             str(ca_key), "-out", str(ca_cert), "-subj", f"/O=lab unsigned/CN={box_name} CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
             f"{tmp}/leaf.csr", "-subj", f"/O=lab unsigned/CN={box_name}"],
            ["x509", "-req", "-in", f"{tmp}/leaf.csr", "-CA", str(ca_cert), "-CAkey",
             str(ca_key), "-CAcreateserial", "-days", "30", "-extfile", str(ext), "-out",
             str(pki_dir / SERVER_CERT)],
        ):
            subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=tmp)
        (pki_dir / CA_CERT).write_bytes(ca_cert.read_bytes())
    key.chmod(0o600)
    cert = (pki_dir / SERVER_CERT).read_bytes()
    (pki_dir / "libvirt" / "clientcert.pem").write_bytes(cert)
    client_key = pki_dir / "libvirt" / "private" / "clientkey.pem"
    client_key.write_bytes(key.read_bytes())
    client_key.chmod(0o600)


def prepare(box_dir: Path, *, box_name: str, store_id: str, address: str, images_dir: Path,
            common_images: Path, pki_dir: Path, simulator_url: str) -> None:
    """The box's libvirtd dirs and config (the shared one's recipe, then TLS and the binds)."""
    libvirt_service.prepare(box_dir, simulator_url)
    images_dir.mkdir(parents=True, exist_ok=True)
    bootstrap_pki(pki_dir, box_name)
    allowed = [dn % store_id for dn in LIBVIRT_TLS_ALLOWED_DNS]
    host_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"store-rollout-lab-box:{box_name}")
    with open(box_dir / "libvirtd.conf", "a") as conf:
        conf.write('listen_tls = 1\nlisten_tcp = 0\n'
                   f'listen_addr = "{address}"\ntls_port = "{LIBVIRT_TLS_PORT}"\n'
                   'auth_tls = "none"\n'
                   f'tls_allowed_dn_list = {json.dumps(allowed)}\n'
                   f'host_uuid = "{host_uuid}"\n')
    qemu_conf = box_dir / "ns" / "etc-libvirt" / "qemu.conf"
    text = qemu_conf.read_text()
    if "migration_address" not in text:
        # the destination QEMU listens, and is told to the source, at the box's address
        qemu_conf.write_text(text + f'migration_address = "{address}"\n'
                                    f'migration_host = "{address}"\n')
    overlay = box_dir / "ns" / "etc-overlay"
    for sub in ("upper", "work"):
        (overlay / sub).mkdir(parents=True, exist_ok=True)
    script = box_dir / "ns-start.sh"
    lines = script.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mount --bind"))
    lines[start:start] = [
        # /etc of this namespace only: an overlay whose changes land in the box's dir
        f"mount -t overlay box-etc -o lowerdir=/etc,upperdir={overlay}/upper,"
        f"workdir={overlay}/work /etc",
        "mkdir -p /etc/pki",
        f"mount --bind {pki_dir} /etc/pki",
        f"mount --bind {images_dir} {common_images}",
    ]
    lines[-1] = lines[-1].replace("exec /usr/sbin/libvirtd ", "exec /usr/sbin/libvirtd --listen ")
    script.write_text("\n".join(lines) + "\n")


def start(box_dir: Path, log: Path, netns_fd: int) -> ProcessRecord:
    """libvirtd in the network namespace `netns_fd` (the box's), in a mount namespace of its own;
    the record is libvirtd itself (nsenter and unshare without --fork exec)."""
    sock = box_dir / "sock" / "libvirt-sock"
    if sock.exists():
        sock.unlink()
    return spawn(["nsenter", f"--net=/proc/self/fd/{netns_fd}", "--",
                  "unshare", "--mount", "--propagation", "private",
                  str(box_dir / "ns-start.sh")], log, pass_fds=(netns_fd,))


def wait_ready(box_dir: Path, timeout: float = 30) -> None:
    libvirt_service.wait_ready(box_dir, timeout)


def open_netns_of(pid: int) -> int:
    """An fd of the network namespace process `pid` is in (a box's minion)."""
    return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
