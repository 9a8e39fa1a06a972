"""A store's WAN link in the lab (lab/wan.py): a machine on `lte` downloads at 10 Mbit/s and
uploads at 2 Mbit/s (the kernel's tbf), waits 60 ms more per round trip (the gateway's delay
line), and a cut drops its traffic silently until restored, on the same TCP connection. Real
namespaces and a real gateway; needs root, as tests/unit/lab/test_store_network.py."""

from __future__ import annotations

import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lab import wan
from lab.state import REPO_ROOT
from lab.store_network import StoreNetwork, link_name, machine_address
from tests.helpers import wait_for

HOST_NAMESPACE = REPO_ROOT / "lab" / "host_namespace.py"

# the machine's side: commands on stdin, one JSON answer per line on stdout
PROBE = r"""
import json, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
def get(sock, path, body=b""):
    method = "POST" if body else "GET"
    sock.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % (method, path, len(body))).encode() + body)
def read_reply(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"!"
    head, rest = data.split(b"\r\n\r\n", 1)
    length = int([h.split(b":")[1] for h in head.split(b"\r\n")
                  if h.lower().startswith(b"content-length")][0])
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    return rest
sock = socket.create_connection((host, port), timeout=30)
for line in sys.stdin:
    cmd, arg = (line.split() + ["0"])[:2]
    out = {}
    try:
        if cmd == "ping":
            times = []
            for _ in range(int(arg)):
                t = time.monotonic(); get(sock, "/bytes/1"); read_reply(sock)
                times.append(time.monotonic() - t)
            out["times"] = times
        elif cmd == "down":
            t = time.monotonic(); get(sock, "/bytes/" + arg); n = len(read_reply(sock))
            out = {"bytes": n, "seconds": time.monotonic() - t}
        elif cmd == "up":
            t = time.monotonic(); get(sock, "/upload", b"u" * int(arg)); read_reply(sock)
            out = {"bytes": int(arg), "seconds": time.monotonic() - t}
        elif cmd == "send":
            get(sock, "/bytes/" + arg); out["sent"] = True
        elif cmd == "recv":
            sock.settimeout(float(arg)); out["bytes"] = len(read_reply(sock)); sock.settimeout(30)
    except Exception as exc:
        out["error"] = type(exc).__name__
    print(json.dumps(out), flush=True)
"""


class Orchestrator(http.server.BaseHTTPRequestHandler):
    """The lab's services' side: /bytes/N answers N incompressible-enough bytes, /upload reads."""

    protocol_version = "HTTP/1.1"
    payload = os.urandom(4 << 20)

    def do_GET(self) -> None:
        self.answer(self.payload[:int(self.path.rsplit("/", 1)[1])])

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.answer(b"ok")

    def answer(self, body: bytes) -> None:
        # one write: headers and body apart would meet the client's delayed ACK (40 ms)
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def lab_like(tmp_path: Path) -> Iterator[tuple[Any, StoreNetwork, int]]:
    """A gateway of its own forwarding one orchestrator port, and the two files lab/wan.py
    reads of a lab (the gateway's state, the simulator's address book)."""
    if os.geteuid() != 0:
        pytest.fail("needs root: the store network is made of network namespaces")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Orchestrator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    state = tmp_path / "store-network" / "state.json"
    state.parent.mkdir()
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "addresses.json").write_text(json.dumps(
        {"store-w1-hv": 0, "store-w1-vm": 1, "store-w2-hv": 2}))
    gateway = subprocess.Popen([sys.executable, "-m", "lab.store_network", "--state-file",
                                str(state), f"--forward={port}"], cwd=REPO_ROOT)
    try:
        wait_for(state.exists, timeout=20, what="the store network's state file")
        info = SimpleNamespace(store_network_state=str(state), state_dir=str(tmp_path))
        yield info, StoreNetwork.load(state), port
    finally:
        gateway.terminate()
        gateway.wait(10)
        server.shutdown()


class Machine:
    def __init__(self, info: Any, network: StoreNetwork, port: int, machine_id: str,
                 index: int) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--net", "--", sys.executable, str(HOST_NAMESPACE),
             *network.join_args(machine_id, machine_address(index)),
             *wan.join_options(info, machine_id), "--",
             sys.executable, "-c", PROBE, network.gateway, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        record = Path(info.state_dir) / "simulator" / "minions" / machine_id / "process.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"pid": self.proc.pid}))

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def kbit_per_s(answer: dict[str, Any]) -> float:
    assert "error" not in answer, answer
    return float(answer["bytes"]) * 8 / answer["seconds"] / 1000


def test_the_profiles_and_the_commands_that_make_them() -> None:
    lte = wan.profile("lte")
    assert (lte.down_kbit, lte.up_kbit, lte.delay_ms, lte.jitter_ms, lte.loss_pct) == \
        (10_000, 2_000, 60, 20, 1.0)
    assert not wan.profile("lan").shaped
    with pytest.raises(ValueError, match="link profile 'wifi': use one of lan, dsl, lte"):
        wan.profile("wifi")
    assert wan.tbf_args(10_000)[:3] == ["tbf", "rate", "10000kbit"]
    assert wan.drop_rules("10.77.1.1", 1.0, cut=False) == [
        ["LAB_WAN_IN", "-s", "10.77.1.1", "-m", "statistic", "--mode", "random",
         "--probability", "0.010000", "-j", "DROP"],
        ["LAB_WAN_OUT", "-d", "10.77.1.1", "-m", "statistic", "--mode", "random",
         "--probability", "0.010000", "-j", "DROP"]]
    assert wan.drop_rules("10.77.1.1", 1.0, cut=True)[0] == \
        ["LAB_WAN_IN", "-s", "10.77.1.1", "-j", "DROP"]
    assert wan.drop_rules("10.77.1.1", 0.0, cut=False) == []
    assert [wan.store_of(m) for m in ("store-12-hv", "store-12-vm", "store-12-hv-0a0b0c",
                                      "store-1-hv", "erp")] == ["12", "12", "12", "1", None]
    # matched at the end only: a store id may hold "-vm" or "-hv" (review)
    assert [wan.store_of(m) for m in ("store-b-vmx-hv", "store-a-vm-hv", "store-x-hv-y-vm",
                                      "store-x-hv-y-hv")] == ["b-vmx", "a-vm", "x-hv-y", "x-hv-y"]


def test_a_delay_line_whose_writer_failed_stops_reading_and_returns() -> None:
    """A connection whose machine side broke must not hang its other direction's reader for
    ever (a Salt publish connection never ends by itself) - review finding."""
    import asyncio

    from lab.store_network import _pipe

    class Broken:
        def write(self, data: bytes) -> None:
            pass

        async def drain(self) -> None:
            raise ConnectionResetError("gone")

        def close(self) -> None:
            pass

        def can_write_eof(self) -> bool:
            return False

    async def run() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(b"x" * 1000)  # then nothing more, never EOF: a publish connection

        async def keep_feeding() -> None:
            while True:
                reader.feed_data(b"y" * 1000)
                await asyncio.sleep(0.001)

        feeder = asyncio.create_task(keep_feeding())
        try:
            await asyncio.wait_for(_pipe(reader, Broken(), lambda: 0.0), 3)  # type: ignore[arg-type]
        finally:
            feeder.cancel()

    asyncio.run(run())


def test_a_store_on_lte_gets_its_rates_delay_and_a_silent_cut(
        lab_like: tuple[Any, StoreNetwork, int]) -> None:
    info, network, port = lab_like
    wan.set_store_link(info, "w1", "lte")  # before its machine starts: applied as it joins
    lan = Machine(info, network, port, "store-w2-hv", 2)
    lte = Machine(info, network, port, "store-w1-hv", 0)
    try:
        # rates: within 15 % of the profile's (3 MiB down; 1 MiB up, within 20 %)
        down = kbit_per_s(lte.ask(f"down {3 << 20}"))
        assert 10_000 * 0.85 <= down <= 10_000 * 1.15, down
        # (1 MiB: a lost packet at a short upload's tail costs a retransmit timeout, 1 % loss)
        up = kbit_per_s(lte.ask(f"up {1 << 20}"))
        assert 2_000 * 0.8 <= up <= 2_000 * 1.15, up
        assert kbit_per_s(lan.ask(f"down {3 << 20}")) > 50_000  # the other store: no shaping
        # the round trip: 60 ms more (± 20 ms jitter, a lost packet's retransmit now and then)
        rtt = statistics.median(lte.ask("ping 15")["times"]) * 1000
        assert 45 <= rtt <= 120, rtt
        assert statistics.median(lan.ask("ping 15")["times"]) * 1000 < 15
        gateway_qdisc = network.run(["tc", "qdisc", "show", "dev", link_name("store-w1-hv")],
                                    capture_output=True, text=True, check=True).stdout
        assert "tbf" in gateway_qdisc and "10Mbit" in gateway_qdisc

        # the cut: a request sent now is neither answered nor reset; restored, the same
        # connection gets its answer (TCP retransmits what the cut dropped)
        state = wan.cut_store_link(info, "w1")
        assert state["cut"] and state["machines"] == ["store-w1-hv", "store-w1-vm"]
        assert lte.ask("send 1000") == {"sent": True}
        assert lte.ask("recv 4") == {"error": "TimeoutError"}
        assert "bytes" in lan.ask("down 1000")  # another store's link is not cut
        assert wan.restore_store_link(info, "w1")["cut"] is False
        assert lte.ask("recv 30") == {"bytes": 1000}

        # shaping changed on a running machine: the other store to dsl, at once
        wan.set_store_link(info, "w2", "dsl")
        assert 16_000 * 0.85 <= kbit_per_s(lan.ask(f"down {3 << 20}")) <= 16_000 * 1.15
    finally:
        lte.close()
        lan.close()

    # a restarted machine joins shaped again (a store host's reboot recreates its veth)
    again = Machine(info, network, port, "store-w1-hv", 0)
    try:
        assert 10_000 * 0.85 <= kbit_per_s(again.ask(f"down {2 << 20}")) <= 10_000 * 1.15
    finally:
        again.close()
