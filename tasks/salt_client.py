"""Salt master client: event bus, minion keys and one-time autosign tokens, LocalClient calls.

Runs on the Salt master host (as the master's user), like `salt-key` and `salt-run`. The
Prefect tasks built on it live in tasks/salt_master.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store_rollout.contracts import AUTOSIGN_GRAIN, HYPERVISOR_READY_GRAIN, TOKEN_MAP_FILE
from store_rollout.instrument import external

log = logging.getLogger(__name__)


@functools.cache
def prepare_salt_runtime() -> None:
    """Once per process, before the first use of Salt's API (never at import time).

    Salt modules call log.trace()/log.garbage(); loggers a host process (pytest, a worker)
    created before Salt installed its logger class lack them. Salt 3008 also logs "unclosed
    MasterMinion" for objects its own clients create internally, and importing it on Python
    3.11 warns that 'crypt' is deprecated."""
    warnings.filterwarnings("ignore", message=".*'crypt' is deprecated", category=DeprecationWarning)
    import salt._logging  # noqa: F401  registers the TRACE and GARBAGE levels

    for name, level in (("trace", 5), ("garbage", 1)):
        if not hasattr(logging.Logger, name):
            def emit(self: logging.Logger, msg: object, *args: Any, _level: int = level,
                     **kwargs: Any) -> None:
                if self.isEnabledFor(_level):
                    self._log(_level, msg, args, **kwargs)
            setattr(logging.Logger, name, emit)
    logging.getLogger("salt.minion").setLevel(logging.ERROR)
    logging.getLogger("salt.wheel").setLevel(logging.ERROR)

MINION_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


class SaltError(Exception):
    """A Salt operation failed."""


class SaltTransientError(SaltError):
    """A failure worth retrying: a minion did not answer, the bus timed out."""


class SaltMinionNoResponse(SaltTransientError):
    """The targeted minion did not return within the timeout."""

    def __init__(self, minion_id: str, fun: str, timeout: float) -> None:
        super().__init__(f"minion {minion_id!r} did not answer {fun} within {timeout:.0f}s")
        self.minion_id = minion_id


class SaltEventTimeout(SaltTransientError):
    """An awaited event did not arrive in time."""


class SaltMasterUnavailable(SaltTransientError):
    """The master did not take the request (not running, restarting, its socket gone)."""


class SaltCommandFailed(SaltError):
    """The minion answered with a non-zero retcode."""

    def __init__(self, minion_id: str, fun: str, retcode: int, detail: str) -> None:
        super().__init__(f"{fun} on {minion_id!r} failed (retcode {retcode}): {detail}")
        self.minion_id, self.fun, self.retcode, self.detail = minion_id, fun, retcode, detail


# Salt's loader is not thread-safe: a batch's stores (threads of one process) that built their
# clients at once failed in salt.grains.core ("'NoneType' object has no attribute 'copy'") while
# the wheel client loaded the master's grains. Clients are built, and used first, one at a time.
_SALT_LOADING = threading.Lock()


def key_state_in(keys: dict[str, list[str]], minion_id: str) -> str | None:
    """A minion's key state in a `key.list_all` answer: 'accepted', 'pending', 'rejected',
    'denied' or None."""
    for state, bucket in (("accepted", "minions"), ("pending", "minions_pre"),
                          ("rejected", "minions_rejected"), ("denied", "minions_denied")):
        if minion_id in keys.get(bucket, []):
            return state
    return None


def check_minion_id(minion_id: str) -> str:
    """Minion ids are plain names: no glob or regex characters, so an exact match is exact."""
    if not MINION_ID_RE.fullmatch(minion_id):
        raise ValueError(f"minion id {minion_id!r} invalid: use lowercase letters, digits, '.', '-'")
    return minion_id


@dataclass
class SaltEvent:
    tag: str
    data: dict[str, Any]
    received: float = field(default_factory=time.time)

    @property
    def minion(self) -> str | None:
        return self.data.get("id")

    @property
    def payload(self) -> dict[str, Any]:
        """Data of a minion-fired event is nested one level (notes/salt.md §5)."""
        inner = self.data.get("data")
        return inner if isinstance(inner, dict) else self.data


# what the master logs (salt/channel/server.py, 3006.10+ and 3008) when a minion's auth
# protocol is older than its minimum_auth_version: it fires no event, and the minion only
# hears "bad load"
AUTH_PROTOCOL_REFUSED = re.compile(
    r"Rejected authentication attempt from minion '(?P<minion>[^']+)' using protocol "
    r"version (?P<version>\d+) \(minimum required: (?P<minimum>\d+)\)")


@dataclass(frozen=True)
class AuthRefusal:
    """The master refused a minion's sign-in for its auth protocol version."""

    minion: str
    version: int
    minimum: int


class MasterLogTail:
    """The lines the master logs from now on (its `log_file`, on this host like the master's
    config and autosign files): the one place a refused auth protocol shows."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size if self.path else 0
        except OSError:
            return 0

    def new_lines(self) -> list[str]:
        if self.path is None:
            return []
        size = self._size()
        if size < self.offset:  # rotated: the new file is read from its start
            self.offset = 0
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return []
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += complete
        return data[:complete].decode(errors="replace").splitlines()

    def auth_refusals(self, minion_id: str) -> list[AuthRefusal]:
        found = (AUTH_PROTOCOL_REFUSED.search(line) for line in self.new_lines())
        return [AuthRefusal(m["minion"], int(m["version"]), int(m["minimum"]))
                for m in found if m and m["minion"] == minion_id]


def new_autosign_token() -> str:
    """192 random bits as hex: a value the seed disk and the guest's store-identity accept
    as is (a urlsafe token may begin with '-' or '_', which they refuse)."""
    return secrets.token_hex(24)


class SaltMasterClient:
    """Thin client over the master's Python API: bus, wheel (keys) and LocalClient.

    `local_client` and `wheel_client` build Salt's LocalClient and WheelClient (default: from
    the master config); a test passes factories of fakes instead."""

    def __init__(self, master_config: str | Path, *, local_client: Callable[[], Any] | None = None,
                 wheel_client: Callable[[], Any] | None = None) -> None:
        self.master_config = str(master_config)
        self._opts: dict[str, Any] | None = None
        self._new_local = local_client or self._salt_local_client
        self._new_wheel = wheel_client or self._salt_wheel_client
        self._wheel_client: Any = None
        self._local_client: Any = None

    @property
    def opts(self) -> dict[str, Any]:
        if self._opts is None:
            prepare_salt_runtime()
            import salt.config

            if not Path(self.master_config).exists():
                raise SaltError(f"Salt master config {self.master_config} not found "
                                "(setting salt_master_config)")
            self._opts = salt.config.master_config(self.master_config)
        return self._opts

    # -- event bus ---------------------------------------------------------------------
    @contextmanager
    def subscribe(self, prefix: str = "") -> Iterator[Any]:
        import salt.utils.event

        with salt.utils.event.get_master_event(self.opts, self.opts["sock_dir"],
                                               listen=True) as bus:
            bus.subscribe(prefix)
            yield bus

    def wait_for_event(self, bus: Any, match: Callable[[SaltEvent], bool], timeout: float,
                       what: str, seen: Callable[[SaltEvent], None] | None = None) -> SaltEvent:
        """Next event on an open bus that `match`es; `seen` gets every event on the way."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with external("hardware_wait"):
                raw = bus.get_event(wait=min(1.0, max(0.05, deadline - time.monotonic())),
                                    full=True)
            if not raw:
                continue
            event = SaltEvent(raw["tag"], raw.get("data") or {})
            if seen:
                seen(event)
            if match(event):
                return event
        raise SaltEventTimeout(f"no event {what} within {timeout:.0f}s")

    def fire(self, tag: str, data: dict[str, Any]) -> None:
        import salt.utils.event

        with salt.utils.event.get_master_event(self.opts, self.opts["sock_dir"],
                                               listen=False) as bus:
            bus.fire_event(data, tag)

    @contextmanager
    def _master_call(self, what: str) -> Iterator[None]:
        """Salt's client exceptions as SaltError: the master not answering is transient."""
        import salt.exceptions as exc_

        try:
            yield
        except (exc_.SaltClientError, exc_.SaltReqTimeoutError, exc_.SaltClientTimeout,
                OSError) as exc:
            self.close()  # a stale connection (master restart): the next call builds anew
            raise SaltMasterUnavailable(f"Salt master ({self.master_config}) did not take {what}: "
                                        f"{type(exc).__name__}: {exc}") from exc
        except exc_.SaltException as exc:  # authentication, authorization, bad arguments
            self.close()
            raise SaltError(f"Salt master ({self.master_config}) refused {what}: "
                            f"{type(exc).__name__}: {exc}") from exc

    # -- keys --------------------------------------------------------------------------
    def _salt_wheel_client(self) -> Any:
        import salt.wheel

        return salt.wheel.WheelClient(self.opts)

    def _wheel(self, fun: str, **kwarg: Any) -> Any:
        with external("salt"), self._master_call(fun):
            first = self._wheel_client is None
            # a new client loads the wheel modules (~0.2 s: once) and, at its first call, grains
            with _SALT_LOADING if first else contextlib.nullcontext():
                if self._wheel_client is None:
                    self._wheel_client = self._new_wheel()
                try:
                    return self._wheel_client.cmd(fun, kwarg=kwarg or None, print_event=False)
                except Exception:
                    self.close()
                    raise

    def key_state(self, minion_id: str) -> str | None:
        """'accepted', 'pending', 'rejected', 'denied' or None."""
        return key_state_in(self._wheel("key.list_all"), minion_id)

    def list_keys(self) -> dict[str, list[str]]:
        return dict(self._wheel("key.list_all"))

    def delete_key(self, minion_id: str) -> bool:
        """Delete the key of exactly this id (key.delete_dict: no glob), in every state."""
        check_minion_id(minion_id)
        keys = self.list_keys()
        found = {bucket: [minion_id] for bucket in
                 ("minions", "minions_pre", "minions_rejected", "minions_denied")
                 if minion_id in keys.get(bucket, [])}
        if not found:
            return False
        self._wheel("key.delete_dict", match=found)
        return True

    def log_tail(self) -> MasterLogTail:
        """The master's log from now on; none when it logs to syslog or a socket."""
        log_file = str(self.opts.get("log_file") or "")
        local = log_file and "://" not in log_file
        return MasterLogTail(Path(log_file) if local else None)

    def fingerprints(self, minion_id: str) -> dict[str, list[str]]:
        """The fingerprints of every key that claims this id, by state (`minions`,
        `minions_denied`, ...): a denied id may have several."""
        check_minion_id(minion_id)
        found = self._wheel("key.finger", match=minion_id) or {}
        return {state: [fp] if isinstance(fp, str) else list(fp)
                for state, by_id in found.items() if isinstance(by_id, dict)
                for mid, fp in by_id.items() if mid == minion_id}

    # -- one-time autosign tokens ------------------------------------------------------
    @property
    def autosign_file(self) -> Path:
        return Path(self.opts["autosign_grains_dir"]) / AUTOSIGN_GRAIN

    @contextmanager
    def _autosign_locked(self) -> Iterator[list[str]]:
        path = self.autosign_file
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_suffix(".lock")
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # the master's autosign guard takes this lock and edits these files too
            self._give_to_master(lock_path)
            lines = path.read_text().splitlines() if path.exists() else []
            tokens = [t for t in (line.strip() for line in lines) if t]
            before = list(tokens)
            yield tokens
            if tokens != before:
                tmp = path.with_suffix(".tmp")
                tmp.write_text("".join(f"{t}\n" for t in tokens))
                os.chmod(tmp, 0o600)
                self._give_to_master(tmp)
                tmp.replace(path)  # the master re-reads the file on each auth

    def _give_to_master(self, path: Path) -> None:
        """The master reads the autosign file as its own user (`user:` in its config; Leap's
        salt-master runs as `salt`): a worker running as root hands the file over; a worker
        running as another user cannot, and says so."""
        import pwd

        master_user = self.opts.get("user") or "root"
        try:
            owner = pwd.getpwnam(master_user)
        except KeyError:
            raise SaltError(f"the Salt master's user {master_user!r} (`user:` in "
                            f"{self.master_config}) does not exist on this host") from None
        if os.geteuid() == owner.pw_uid:
            return
        if os.geteuid() != 0:
            raise SaltError(
                f"the Salt master runs as {master_user!r} but this worker as uid {os.geteuid()}: "
                f"the master could not read {path.with_suffix('')} (mode 600); run the worker "
                f"as {master_user!r} or root")
        os.chown(path, owner.pw_uid, owner.pw_gid)

    @property
    def _token_map_file(self) -> Path:
        return Path(self.opts["autosign_grains_dir"]).parent / TOKEN_MAP_FILE

    def _token_map(self) -> dict[str, str]:
        path = self._token_map_file
        return json.loads(path.read_text()) if path.exists() else {}

    def _write_token_map(self, mapping: dict[str, str]) -> None:
        tmp = self._token_map_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(mapping, sort_keys=True))
        os.chmod(tmp, 0o600)
        self._give_to_master(tmp)  # the master's autosign guard reads it
        tmp.replace(self._token_map_file)

    def issue_token(self, minion_id: str) -> str:
        """A one-time autosign token for exactly one minion id (reused until revoked)."""
        check_minion_id(minion_id)
        with self._autosign_locked() as tokens:
            mapping = self._token_map()
            token = mapping.get(minion_id) or new_autosign_token()
            mapping[minion_id] = token
            self._write_token_map(mapping)
            if token not in tokens:
                tokens.append(token)
        return token

    def token_for(self, minion_id: str) -> str | None:
        with self._autosign_locked():
            return self._token_map().get(minion_id)

    def revoke_token(self, minion_id: str) -> bool:
        """Remove the minion's token: once its key is accepted it must not sign anything else."""
        with self._autosign_locked() as tokens:
            mapping = self._token_map()
            token = mapping.pop(minion_id, None)
            self._write_token_map(mapping)
            if token and token in tokens:
                tokens.remove(token)
                return True
        return False

    def autosign_tokens(self) -> list[str]:
        with self._autosign_locked() as tokens:
            return list(tokens)

    # -- remote execution --------------------------------------------------------------
    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        """Run `fun` on one minion; returns its `ret`. Raises on no answer or retcode != 0."""
        system = "libvirt" if fun.startswith(("virt.", "storevirt.")) else "salt"
        with external(system), self._master_call(f"{fun} for {minion_id}"):
            result = self._local().cmd(minion_id, fun, list(arg), timeout=timeout,
                                       kwarg=kwarg, full_return=True)
        if minion_id not in result:
            self.close()  # a silent target may mean a stale connection (master restart): renew
            raise SaltMinionNoResponse(minion_id, fun, timeout)
        ret = result[minion_id]
        retcode = int(ret.get("retcode", 0) or 0)
        if retcode != 0:
            raise SaltCommandFailed(minion_id, fun, retcode, summarize_failure(ret.get("ret")))
        return ret.get("ret")

    def cmd_many(self, minion_ids: list[str], fun: str, arg: list[Any] | tuple[Any, ...] = (),
                 kwarg: dict[str, Any] | None = None,
                 timeout: float = 10) -> dict[str, Any]:
        """One job for many minions (a list target); returns {minion: ret} for those that
        answered with retcode 0 and {minion: SaltCommandFailed} for those that failed. A minion
        that did not answer within `timeout` is absent."""
        if not minion_ids:
            return {}
        system = "libvirt" if fun.startswith(("virt.", "storevirt.")) else "salt"
        with external(system), self._master_call(f"{fun} for {len(minion_ids)} minions"):
            result = self._local().cmd(list(minion_ids), fun, list(arg), timeout=timeout,
                                       tgt_type="list", kwarg=kwarg, full_return=True,
                                       gather_job_timeout=min(timeout, 2))
        answers: dict[str, Any] = {}
        for minion, ret in result.items():
            if not isinstance(ret, dict):  # "Minion did not return" on a find_job miss
                continue
            retcode = int(ret.get("retcode", 0) or 0)
            answers[minion] = (ret.get("ret") if retcode == 0 else SaltCommandFailed(
                minion, fun, retcode, summarize_failure(ret.get("ret"))))
        return answers

    def cmd_async(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = ()) -> str:
        """Publish `fun` to one minion without waiting for it; returns the job id."""
        with external("salt"), self._master_call(f"{fun} for {minion_id}"):
            jid = self._local().cmd_async(minion_id, fun, list(arg))
        if not jid:
            raise SaltMinionNoResponse(minion_id, fun, 0)
        return str(jid)

    def _local(self) -> Any:
        """Salt's LocalClient, built on first use and kept (it holds the master connection)."""
        if self._local_client is None:
            with _SALT_LOADING:
                self._local_client = self._new_local()
        return self._local_client

    def _salt_local_client(self) -> Any:
        import salt.client

        return salt.client.LocalClient(mopts=self.opts)

    def close(self) -> None:
        for client in (self._wheel_client, self._local_client):
            if client is not None:
                client.destroy()
        self._wheel_client = self._local_client = None

    def ping(self, minion_id: str, timeout: float = 5) -> bool:
        try:
            return bool(self.cmd(minion_id, "test.ping", timeout=timeout))
        except SaltError:
            return False


_per_thread = threading.local()


def master_client(master_config: str | Path) -> SaltMasterClient:
    """The calling thread's client for this master: a rollout's steps run in one thread and
    share it, so Salt's clients are built once per rollout, not once per step."""
    clients: dict[str, SaltMasterClient] = _per_thread.__dict__.setdefault("clients", {})
    key = str(master_config)
    if key not in clients:
        clients[key] = SaltMasterClient(key)
    return clients[key]


def failed_states(ret: Any) -> list[dict[str, str]]:
    """States with result False in a state return: [{id, sls, comment}], in run order."""
    if not isinstance(ret, dict):
        return []
    failed = [v for v in ret.values() if isinstance(v, dict) and v.get("result") is False]
    failed.sort(key=lambda v: v.get("__run_num__", 0))
    return [{"id": str(v.get("__id__", "?")), "sls": str(v.get("__sls__", "?")),
             "comment": str(v.get("comment", ""))[:500]} for v in failed]


def summarize_failure(ret: Any) -> str:
    states = failed_states(ret)
    if states:
        return "; ".join(f"{s['id']} ({s['sls']}): {s['comment']}" for s in states)
    if isinstance(ret, list):
        return "; ".join(str(x) for x in ret)[:1000]
    text = str(ret).strip()
    if "Traceback (most recent call last)" in text:  # a minion exception: its last line says why
        text = text.splitlines()[-1]
    return text[:1000]


def hypervisor_state(master: SaltMasterClient, minion_id: str) -> str:
    """Current state, not events: 'ready' (its highstate set the ready grain), 'answering'
    (up, not ready yet) or 'silent' (not installed, booting, or its key not accepted)."""
    try:
        ready = master.cmd(minion_id, "grains.get", [HYPERVISOR_READY_GRAIN], timeout=5)
    except SaltError:
        return "silent"
    return "ready" if ready else "answering"


def hypervisor_ready(master: SaltMasterClient, minion_id: str) -> bool:
    return hypervisor_state(master, minion_id) == "ready"
