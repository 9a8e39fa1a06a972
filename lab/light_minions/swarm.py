"""A swarm of light minions in one asyncio loop: `python -m lab.light_minions.swarm --master-port
P --publish-port Q --ids-file F --dir D` runs one minion per id of F and prints "ready N" on
stdout once every one of them has authenticated and subscribed.

Each minion has its own id, pki_dir and Salt `AsyncAuth`, and its own request channel for
returns. Keys: RSA-2048 from a pool under `<dir>/keys` generated once (`--key-pool`, default one
key per minion); a pool smaller than the swarm shares a key pair between several minion ids
(the master still authenticates each id against its own accepted key file).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import fnmatch
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from lab.light_minions.answers import answer

log = logging.getLogger("light_minions")


def key_pool(keys_dir: Path, count: int) -> list[tuple[Path, Path]]:
    """`count` RSA key pairs (minion.pem, minion.pub) under `keys_dir`, generated once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    keys_dir.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(count):
        pem, pub = keys_dir / f"{i}.pem", keys_dir / f"{i}.pub"
        if not (pem.exists() and pub.exists()):
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pub.write_bytes(key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
            tmp = pem.with_suffix(".tmp")
            tmp.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.TraditionalOpenSSL,
                                              serialization.NoEncryption()))
            os.chmod(tmp, 0o400)
            tmp.replace(pem)
        pairs.append((pem, pub))
    return pairs


def prepare(base: Path, ids: list[str], pool: int, master_pki: Path | None = None,
            keys_dir: Path | None = None) -> dict[str, Path]:
    """Each minion's pki_dir under `base/minions/<id>` with its key pair from the pool; with
    `master_pki`, its public key also accepted on the master (as `salt-key -a` would)."""
    pairs = key_pool(keys_dir or base / "keys", max(1, min(pool, len(ids))))
    dirs = {}
    for i, mid in enumerate(ids):
        pem, pub = pairs[i % len(pairs)]
        pki = base / "minions" / mid / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        for src, name in ((pem, "minion.pem"), (pub, "minion.pub")):
            if not (pki / name).exists():
                shutil.copyfile(src, pki / name)
        os.chmod(pki / "minion.pem", 0o400)
        if master_pki is not None:
            accepted = master_pki / "minions"
            accepted.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pub, accepted / mid)
        dirs[mid] = pki
    return dirs


def targeted(opts: dict[str, Any], load: dict[str, Any]) -> bool:
    """Does this publication name this minion? (glob and list targets; others: no)."""
    tgt, kind = load.get("tgt"), load.get("tgt_type", "glob")
    if kind == "list":
        return opts["id"] in (tgt if isinstance(tgt, list) else str(tgt).split(","))
    if kind == "glob":
        return fnmatch.fnmatch(opts["id"], str(tgt))
    return False


class NoEvents:
    """Stands in for the minion's local event bus (a light minion has none)."""

    def fire_event(self, *_args: Any, **_kwargs: Any) -> None:
        return None

    def destroy(self) -> None:
        return None


class LightMinion:
    def __init__(self, opts: dict[str, Any], stats: dict[str, int]) -> None:
        self.opts = opts
        self.stats = stats
        self.pub: Any = None
        self.req: Any = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        import salt.channel.client

        self.pub = salt.channel.client.AsyncPubChannel.factory(self.opts)
        self.pub.event = NoEvents()
        self.req = salt.channel.client.AsyncReqChannel.factory(self.opts)
        while True:
            try:
                await self.pub.connect()
                break
            except Exception as exc:  # the master not up yet, or a storm: try again
                log.debug("%s: %s", self.opts["id"], exc)
                self.stats["auth_retries"] = self.stats.get("auth_retries", 0) + 1
                await asyncio.sleep(1 + (hash(self.opts["id"]) % 50) / 10)
                self.pub = salt.channel.client.AsyncPubChannel.factory(self.opts)
                self.pub.event = NoEvents()
        self.pub.on_recv(self.on_pub)
        self.ready.set()
        await self.fire("minion_start", f"salt/minion/{self.opts['id']}/start")

    async def fire(self, data: Any, tag: str) -> None:
        """An event on the master's bus, as a minion's event.send does."""
        await self.req.send({"id": self.opts["id"], "cmd": "_minion_event", "tag": tag,
                             "data": data, "tok": self.pub.token, "pretag": None}, timeout=60)

    async def on_pub(self, payload: dict[str, Any]) -> None:
        load = payload.get("load")
        if not isinstance(load, dict) or "fun" not in load or not targeted(self.opts, load):
            return
        self.stats["jobs"] = self.stats.get("jobs", 0) + 1
        fun, args = load["fun"], load.get("arg") or []
        if isinstance(fun, list):  # one job of several functions, as a minion answers it
            each = [answer(self.opts["id"], f, a) for f, a in zip(fun, args, strict=False)]
            ret: Any = {f: r for f, (r, _) in zip(fun, each, strict=False)}
            retcode: Any = {f: c for f, (_, c) in zip(fun, each, strict=False)}
            success: Any = {f: c == 0 for f, c in retcode.items()}
        else:
            ret, retcode = answer(self.opts["id"], fun, args)
            success = retcode == 0
        reply = {"cmd": "_return", "id": self.opts["id"], "jid": load["jid"],
                 "fun": fun, "fun_args": args, "return": ret, "retcode": retcode,
                 "success": success}
        try:
            await self.req.send(reply, timeout=60)
        except Exception as exc:
            self.stats["return_errors"] = self.stats.get("return_errors", 0) + 1
            log.warning("%s: return of %s failed: %s", self.opts["id"], load["jid"], exc)


def minion_opts(base_opts: dict[str, Any], mid: str, pki: Path, master_port: int,
                publish_port: int) -> dict[str, Any]:
    opts = copy.deepcopy(base_opts)
    root = pki.parent
    opts.update({"id": mid, "pki_dir": str(pki), "cachedir": str(root / "cache"),
                 "sock_dir": str(root / "sock"), "master": "127.0.0.1",
                 "master_ip": "127.0.0.1", "master_port": master_port,
                 "publish_port": publish_port, "master_uri": f"tcp://127.0.0.1:{master_port}",
                 "acceptance_wait_time": 2, "auth_timeout": 60, "auth_tries": 7,
                 "random_reauth_delay": 5})
    return opts


def share_zmq_context() -> None:
    """One ZeroMQ context (its I/O threads) for every minion of the swarm, as the sockets of one
    process would share it: Salt's transport makes a context per client (each with its own I/O
    and reaper threads), which at 2,000 minions is ~10,000 threads. The sockets, their framing
    and Salt's crypto stay Salt's own; closing a client closes its sockets, not the context."""
    import zmq
    import zmq.asyncio

    class Shared(zmq.asyncio.Context):
        def term(self) -> None:
            return None

        def destroy(self, linger: int | None = None) -> None:
            return None

    shared = Shared(io_threads=2)
    shared.set(zmq.MAX_SOCKETS, 65536)
    zmq.asyncio.Context = lambda *_a, **_k: shared  # type: ignore[misc,assignment]


async def run(args: argparse.Namespace) -> None:
    import salt.config

    share_zmq_context()

    ids = [line.strip() for line in Path(args.ids_file).read_text().splitlines() if line.strip()]
    base = Path(args.dir)
    dirs = prepare(base, ids, args.key_pool or len(ids),
                   Path(args.master_pki) if args.master_pki else None,
                   Path(args.keys_dir) if args.keys_dir else None)
    defaults = salt.config.minion_config(None)
    stats: dict[str, int] = {}
    minions = [LightMinion(minion_opts(defaults, mid, dirs[mid], args.master_port,
                                       args.publish_port), stats) for mid in ids]
    started = time.monotonic()
    # a bounded number of sign-ins at a time, as a region's minions arrive spread out
    gate = asyncio.Semaphore(args.concurrency)

    async def one(minion: LightMinion) -> None:
        async with gate:
            await minion.start()

    await asyncio.gather(*(one(m) for m in minions))
    print(f"ready {len(minions)} {time.monotonic() - started:.2f}", flush=True)
    while True:  # serve until killed
        await asyncio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ids-file", required=True)
    parser.add_argument("--dir", required=True, help="the swarm's keys and pki dirs")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--publish-port", type=int, required=True)
    parser.add_argument("--master-pki", help="accept each minion's key in this master pki_dir")
    parser.add_argument("--key-pool", type=int, default=0)
    parser.add_argument("--keys-dir", help="the key pool's directory (default <dir>/keys)")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    logging.getLogger("salt").setLevel(logging.ERROR)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
