"""libvirtd + QEMU in a private mount namespace on the lab's store network, state in the lab
dir (notes/libvirt.md §4).

libvirtd joins the store network's namespace (lab/store_network.py): the taps it makes for a
VM's NIC on the network's bridge (`<interface type='bridge'>`, as on a store host's br0) are
made there, never on the host, and a guest on that bridge reaches the lab's services only at
the gateway, as a store VM does. Clients reach libvirtd by its unix socket, as before.

QEMU runs as root without a security driver, so the capability cache stays valid; the host's
/etc/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and /run are replaced by
bind mounts or a tmpfs that exist only inside the namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from lab.procs import ProcessRecord, spawn, wait_until
from lab.store_network import StoreNetwork

QEMU_CONF_APPEND = """
# store-rollout lab
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
stdio_handler = "file"
"""


def uri(libvirt_dir: Path) -> str:
    return f"qemu+unix:///system?socket={libvirt_dir}/sock/libvirt-sock"


def prepare(libvirt_dir: Path, simulator_url: str) -> None:
    """`simulator_url`: the simulator as the store network reaches it (libvirtd's hook runs
    there)."""
    ns = libvirt_dir / "ns"
    for sub in ("sock", "images"):
        (libvirt_dir / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("var-lib-libvirt", "run", "var-cache-libvirt", "var-log-libvirt"):
        (ns / sub).mkdir(parents=True, exist_ok=True)
    etc = ns / "etc-libvirt"
    if not etc.exists():
        shutil.copytree("/etc/libvirt", etc, symlinks=True)
        with open(etc / "qemu.conf", "a") as conf:
            conf.write(QEMU_CONF_APPEND)
        # no default network: it needs dnsmasq and a bridge, i.e. host network changes
        autostart = etc / "qemu" / "networks" / "autostart"
        if autostart.exists():
            shutil.rmtree(autostart)
    # a qemu hook asks the simulator whether this start should fail (fault knob `vm_start`);
    # libvirt aborts the start when the hook exits non-zero in the `prepare` phase
    hooks = etc / "hooks"
    hooks.mkdir(exist_ok=True)
    hook = hooks / "qemu"
    hook.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, urllib.request\n"
        "if len(sys.argv) > 2 and sys.argv[2] == 'prepare':\n"
        f"    req = urllib.request.Request({simulator_url!r} + '/hooks/vm_start',\n"
        "        data=json.dumps({'domain': sys.argv[1], 'xml': sys.stdin.read()}).encode(),\n"
        "        method='POST')\n"
        "    try:\n"
        "        answer = json.load(urllib.request.urlopen(req, timeout=10))\n"
        "    except OSError:\n"
        "        answer = {}\n"
        "    if answer.get('fail'):\n"
        "        print('lab fault: start of %s refused' % sys.argv[1], file=sys.stderr)\n"
        "        sys.exit(1)\n")
    hook.chmod(0o755)
    for sub in ("qemu", "images", "boot", "dnsmasq", "network", "swtpm", "lockd"):
        (ns / "var-lib-libvirt" / sub).mkdir(exist_ok=True)
    (libvirt_dir / "libvirtd.conf").write_text(
        f'unix_sock_dir = "{libvirt_dir}/sock"\n'
        'unix_sock_rw_perms = "0770"\n'
        'auth_unix_rw = "none"\nauth_unix_ro = "none"\n'
        f'log_outputs = "3:file:{libvirt_dir}/libvirtd.log"\n'
    )
    script = libvirt_dir / "ns-start.sh"
    script.write_text(
        "#!/bin/bash\nset -e\n"
        f"mount --bind {ns}/etc-libvirt /etc/libvirt\n"
        f"mount --bind {ns}/var-lib-libvirt /var/lib/libvirt\n"
        f"mount --bind {ns}/var-cache-libvirt /var/cache/libvirt\n"
        f"mount --bind {ns}/var-log-libvirt /var/log/libvirt\n"
        # a private /run so nothing (not even /run/libvirt) appears on the host
        f"mount --bind {ns}/run /run\n"
        f"exec /usr/sbin/libvirtd -f {libvirt_dir}/libvirtd.conf -p {libvirt_dir}/libvirtd.pid\n"
    )
    script.chmod(0o755)


def start(libvirt_dir: Path, log: Path, network: StoreNetwork) -> ProcessRecord:
    sock = libvirt_dir / "sock" / "libvirt-sock"
    if sock.exists():
        sock.unlink()  # stale socket from a crashed lab
    fd = network.open_namespace()  # checked to be the gateway's, not a recycled PID's
    try:
        # nsenter and unshare without --fork exec: the record is libvirtd itself
        return spawn(["nsenter", f"--net=/proc/self/fd/{fd}", "--",
                      "unshare", "--mount", "--propagation", "private",
                      str(libvirt_dir / "ns-start.sh")], log, pass_fds=(fd,))
    finally:
        os.close(fd)


def _connects(libvirt_uri: str) -> bool:
    import libvirt

    conn = libvirt.open(libvirt_uri)
    try:
        return conn.getLibVersion() > 0
    finally:
        conn.close()


def wait_ready(libvirt_dir: Path, timeout: float = 30) -> None:
    wait_until(lambda: _connects(uri(libvirt_dir)), timeout, "libvirtd", interval=0.2)


def probe_capabilities(libvirt_uri: str) -> None:
    """Have libvirtd probe QEMU now (its first capabilities read takes about 8 s, seen here),
    not in the first virt.init a test or a store makes; lab up runs it while Prefect starts."""
    import libvirt

    with contextlib.suppress(libvirt.libvirtError):
        conn = libvirt.open(libvirt_uri)
        try:
            conn.getCapabilities()
        finally:
            conn.close()


def vm_type(libvirt_uri: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """"kvm" when this machine can run KVM guests, else "qemu" (TCG).

    As cpu-checker's kvm-ok decides: libvirt must offer KVM (/dev/kvm usable) and the CPU must
    have hardware virtualization (vmx or svm). A /dev/kvm without them (seen on CI machines,
    nested under a hypervisor that hides them) opens, but a guest's firmware then hangs in
    GRUB; TCG boots the same image in about a minute."""
    import libvirt

    flags = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    if not flags & {"vmx", "svm"}:
        return "qemu"
    conn = libvirt.open(libvirt_uri)
    try:
        conn.getDomainCapabilities(None, "x86_64", None, "kvm")
        return "kvm"
    except libvirt.libvirtError:
        return "qemu"
    finally:
        conn.close()
