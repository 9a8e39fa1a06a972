"""The lab's store network (lab/store_network.py, lab/host_namespace.py): a machine on it
reaches the orchestrator's services only at the gateway, has no route anywhere else, and the
host's own interfaces never change. Needs root (network namespaces)."""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.procs import free_port
from lab.state import REPO_ROOT
from lab.store_network import (
    DHCP_FIRST,
    GATEWAY,
    NETWORK,
    StoreNetwork,
    link_name,
    machine_address,
)
from tests.helpers import wait_for

HOST_NAMESPACE = REPO_ROOT / "lab" / "host_namespace.py"

# what the machine checks from inside: its own view of the network
PROBE = """
import json, os, socket, sys, urllib.request
gateway_url, loopback_port = sys.argv[1], int(sys.argv[2])
def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__ + ": " + str(exc)
with urllib.request.urlopen(gateway_url, timeout=5) as r:
    body = r.read().decode()
print(json.dumps({"netns": os.readlink("/proc/self/ns/net"), "body": body,
                  "interfaces": [name for _i, name in socket.if_nameindex()],
                  "loopback": connect("127.0.0.1", loopback_port),
                  "outside": connect("192.0.2.1", 80)}))
"""


def host_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


@pytest.fixture
def orchestrator_server() -> Iterator[int]:
    """A service on the orchestrator's loopback, as the lab's master or image server."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"from the orchestrator")

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()


@pytest.fixture
def network(tmp_path: Path, orchestrator_server: int) -> Iterator[StoreNetwork]:
    if os.geteuid() != 0:
        pytest.fail("needs root: the store network is made of network namespaces")
    state = tmp_path / "store-network.json"
    gateway = subprocess.Popen([sys.executable, "-m", "lab.store_network", "--state-file",
                                str(state), f"--forward={orchestrator_server}"], cwd=REPO_ROOT)
    try:
        wait_for(state.exists, timeout=20, what="the store network's state file")
        yield StoreNetwork.load(state)
    finally:
        gateway.terminate()
        gateway.wait(10)


def test_a_machine_reaches_the_orchestrator_only_at_the_gateway(
        network: StoreNetwork, orchestrator_server: int) -> None:
    before = host_links()
    address = machine_address(0)
    machine = subprocess.run(
        ["unshare", "--net", "--", sys.executable, str(HOST_NAMESPACE),
         *network.join_args("store-t1-hv", address), "--",
         sys.executable, "-c", PROBE, network.url(orchestrator_server),
         str(orchestrator_server)],
        capture_output=True, text=True, timeout=60, check=False)
    assert machine.returncode == 0, machine.stderr
    seen = json.loads(machine.stdout)
    assert seen["body"] == "from the orchestrator"  # forwarded by the gateway
    assert seen["netns"] != os.readlink("/proc/self/ns/net")
    assert seen["interfaces"] == ["lo", "eth0"]
    assert "ConnectionRefused" in seen["loopback"]  # the orchestrator's loopback is not its own
    assert "unreachable" in seen["outside"]  # no route, no NAT out of the store network
    # the machine had the address the lab gave it; the gateway side of its veth was on the
    # bridge in the gateway's namespace, never on the host
    gateway_links = network.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                                check=True).stdout
    assert network.bridge in gateway_links
    assert host_links() == before
    assert link_name("store-t1-hv") not in " ".join(before)


def test_an_address_is_given_and_the_machine_has_it(network: StoreNetwork) -> None:
    address = machine_address(3)
    machine = subprocess.run(
        ["unshare", "--net", "--", sys.executable, str(HOST_NAMESPACE),
         *network.join_args("store-t2-vm", address), "--", "ip", "-o", "-4", "addr", "show",
         "dev", "eth0"], capture_output=True, text=True, timeout=60, check=False)
    assert machine.returncode == 0, machine.stderr
    assert f"inet {address}/{NETWORK.prefixlen}" in machine.stdout


def test_joining_refuses_the_hosts_own_namespace(network: StoreNetwork) -> None:
    """Without `unshare --net` the veth would land on the host: refused, nothing added."""
    before = host_links()
    refused = subprocess.run(
        [sys.executable, str(HOST_NAMESPACE), *network.join_args("store-t3-hv",
                                                                 machine_address(1)),
         "--", "true"], capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1
    assert "not in a new network namespace" in refused.stderr
    assert host_links() == before


def test_a_gateway_that_is_gone_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="store network is not up.*lab up"):
        StoreNetwork.load(tmp_path / "missing.json")
    stale = StoreNetwork(pid=os.getpid(), netns_inode=1, gateway=GATEWAY, prefix=16,
                         bridge="storebr0", forwarded=[free_port()])
    with pytest.raises(RuntimeError, match=f"gateway \\(pid {os.getpid()}\\) is gone"):
        stale.open_namespace()


def test_a_gateway_killed_by_pid_leaves_nothing_behind(tmp_path: Path) -> None:
    """A gateway killed by PID alone (a bench's, in the caller's process group) runs no child
    (the store network's DHCP server is Cobbler's dnsmasq, a lab service of its own), so
    nothing is left holding the caller's output pipes."""
    state = tmp_path / "store-network.json"
    gateway = subprocess.Popen([sys.executable, "-m", "lab.store_network", "--state-file",
                                str(state)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        wait_for(state.exists, timeout=20, what="the store network's state file")
        children = Path(f"/proc/{gateway.pid}/task/{gateway.pid}/children").read_text().split()
        assert children == []
    finally:
        gateway.kill()
        gateway.wait(10)
    assert gateway.stdout is not None
    gateway.stdout.read()  # EOF: no process is left holding the pipe


def test_addresses_and_link_names() -> None:
    assert machine_address(0) == "10.77.1.1"
    assert machine_address(255) == "10.77.2.0"
    with pytest.raises(ValueError, match="no address for machine"):
        machine_address(NETWORK.num_addresses)
    # the simulated machines' addresses stop where the DHCP server's (booted guests') begin
    last = int(ipaddress.IPv4Address(DHCP_FIRST)) - int(ipaddress.IPv4Address("10.77.1.1")) - 1
    assert machine_address(last) == str(ipaddress.IPv4Address(DHCP_FIRST) - 1)
    with pytest.raises(ValueError, match="no address for machine"):
        machine_address(last + 1)
    names = {link_name(f"store-{i}-hv") for i in range(500)}
    assert len(names) == 500 and all(len(n) <= 15 for n in names)


def test_minion_sockets_fit_the_kernels_limit_or_the_lab_dir_is_named(tmp_path: Path) -> None:
    """The minion's event socket path does not grow with the store id (CI's checkout path plus
    `store-sec-canary-hv` went past the limit and the minion died at start)."""
    from lab.simulator.minions import SALT_LONGEST_SOCKET_NAME, UNIX_PATH_MAX, minion_root_dir

    ci_like = Path("/check/work/main/.lab-test-gw0/simulator")
    root = minion_root_dir(ci_like, 4095)
    assert root == ci_like / "roots" / "4095"
    assert len(str(root / "sock" / SALT_LONGEST_SOCKET_NAME)) <= UNIX_PATH_MAX
    # the limit is the kernel's: a socket path of UNIX_PATH_MAX characters binds, one more not
    import socket

    for length, binds in ((UNIX_PATH_MAX, True), (UNIX_PATH_MAX + 1, False)):
        path = tmp_path / ("s" * (length - len(str(tmp_path)) - 1))
        assert len(str(path)) == length
        with socket.socket(socket.AF_UNIX) as sock:
            if binds:
                sock.bind(str(path))
                path.unlink()
            else:
                with pytest.raises(OSError, match="too long"):
                    sock.bind(str(path))
    with pytest.raises(ValueError, match="is too deep.*use a shorter --state-dir"):
        minion_root_dir(Path("/" + "d" * 80) / "simulator", 1)


def test_a_store_hosts_firmware_reports_its_serial_to_dmidecode() -> None:
    """A store host's mount namespace shows the serial its domain's SMBIOS gives, where Linux
    shows firmware tables; the real dmidecode (what Salt's `serialnumber` grain runs) reads it,
    and the orchestrator's own /sys is untouched."""
    host = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
         str(HOST_NAMESPACE), "--smbios-serial", "LAB525400C0FFEE", "--",
         "dmidecode", "-s", "system-serial-number"],
        capture_output=True, text=True, timeout=30)
    assert (host.returncode, host.stdout.strip()) == (0, "LAB525400C0FFEE"), host.stderr
    assert not Path("/sys/firmware/dmi/tables/smbios_entry_point").exists() or \
        "LAB525400C0FFEE" not in subprocess.run(["dmidecode", "-s", "system-serial-number"],
                                                capture_output=True, text=True).stdout
