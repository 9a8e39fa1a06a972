"""Salt master client: event bus, minion keys and one-time autosign tokens, LocalClient calls.

Runs on the Salt master host (as the master's user), like `salt-key` and `salt-run`. The
Prefect tasks built on it live in tasks/salt_master.py, tasks/firstboot.py and the other step
modules; the waits of steps 3 and 6 in tasks/salt/watchers.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from store_rollout.instrument import external
from tasks.salt.errors import (
    SaltCommandFailed,
    SaltError,
    SaltMasterUnavailable,
    SaltMinionNoResponse,
)
from tasks.salt.events import EventBus, SaltEvent, next_event
from tasks.salt.extensions import served_extension_hashes
from tasks.salt.jobs import cached_return, run_job
from tasks.salt.masterlog import MasterLogTail
from tasks.salt.minions import check_minion_id, key_state_in, keys_of, summarize_failure
from tasks.salt.runtime import SALT_LOADING, prepare_salt_runtime
from tasks.salt.tokens import AutosignTokens


def _system_of(fun: str) -> str:
    """The outside system a call reaches, for the step clock's accounting."""
    return "libvirt" if fun.startswith(("virt.", "storevirt.")) else "salt"


class SaltMasterClient:
    """Thin client over the master's Python API: bus, wheel (keys) and LocalClient (built by
    `local_client` / `wheel_client`, default from the master config; a test passes fakes)."""

    def __init__(self, master_config: str | Path, *, local_client: Callable[[], Any] | None = None,
                 wheel_client: Callable[[], Any] | None = None) -> None:
        self.master_config = str(master_config)
        self._opts: dict[str, Any] | None = None
        self._new_local = local_client or self._salt_local_client
        self._new_wheel = wheel_client or self._salt_wheel_client
        self._wheel_client: Any = None
        self._local_client: Any = None
        self._fileserver: Any = None

    @property
    def opts(self) -> dict[str, Any]:
        if self._opts is None:
            prepare_salt_runtime()
            import salt.config

            if not Path(self.master_config).exists():
                raise SaltError(f"Salt master config {self.master_config} not found "
                                "(setting salt_master_config)", master_config=self.master_config)
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

    def wait_for_event(self, bus: EventBus, match: Callable[[SaltEvent], bool], timeout: float,
                       what: str, seen: Callable[[SaltEvent], None] | None = None) -> SaltEvent:
        """Next event on an open bus that `match`es; `seen` gets every event on the way."""
        return next_event(bus, match, timeout, what, seen)

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
            raise SaltMasterUnavailable(self.master_config, what, exc) from exc
        except exc_.SaltException as exc:  # authentication, authorization, bad arguments
            self.close()
            raise SaltError(f"Salt master ({self.master_config}) refused {what}: "
                            f"{type(exc).__name__}: {exc}", operation=what,
                            master_config=self.master_config) from exc

    # -- keys --------------------------------------------------------------------------
    def _salt_wheel_client(self) -> Any:
        import salt.wheel

        return salt.wheel.WheelClient(self.opts)

    def _wheel(self, fun: str, **kwarg: Any) -> Any:
        with external("salt"), self._master_call(fun):
            first = self._wheel_client is None
            # a new client loads the wheel modules (~0.2 s: once) and, at its first call, grains
            with SALT_LOADING if first else contextlib.nullcontext():
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
        return bool(self.delete_keys([minion_id]))

    def delete_keys(self, minion_ids: list[str]) -> list[str]:
        """Delete the keys of exactly these ids, in every state, in one `key.delete_dict` (the
        master rotates its AES key once per deletion call: every minion re-authenticates).
        Returns the ids that had a key."""
        found = keys_of(self.list_keys(), [check_minion_id(m) for m in minion_ids])
        if found:
            self._wheel("key.delete_dict", match=found)
        return [m for m in minion_ids if any(m in ids for ids in found.values())]

    def log_tail(self) -> MasterLogTail:
        """The master's log from now on; none when it logs to syslog or a socket."""
        log_file = str(self.opts.get("log_file") or "")
        return MasterLogTail(Path(log_file) if log_file and "://" not in log_file else None)

    def fingerprints(self, minion_id: str) -> dict[str, list[str]]:
        """The fingerprints of every key that claims this id, by state (`minions`,
        `minions_denied`, ...): a denied id may have several."""
        check_minion_id(minion_id)
        found = self._wheel("key.finger", match=minion_id) or {}
        return {state: [fp] if isinstance(fp, str) else list(fp)
                for state, by_id in found.items() if isinstance(by_id, dict)
                for mid, fp in by_id.items() if mid == minion_id}

    # -- one-time autosign tokens (the store: tasks/salt/tokens.py) -------------------------
    @property
    def tokens(self) -> AutosignTokens:
        return AutosignTokens(self.opts["autosign_grains_dir"], self.opts.get("user") or "root",
                              self.master_config)

    def issue_token(self, minion_id: str) -> str:
        """A one-time autosign token for exactly one minion id (reused until revoked)."""
        return self.tokens.issue(minion_id)

    def token_for(self, minion_id: str) -> str | None:
        return self.tokens.token_for(minion_id)

    def revoke_token(self, minion_id: str) -> bool:
        """Remove the minion's token: once its key is accepted it must not sign anything else."""
        return self.tokens.revoke(minion_id)

    def autosign_tokens(self) -> list[str]:
        return self.tokens.all()

    # -- remote execution --------------------------------------------------------------
    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any:
        """Run `fun` on one minion; returns its `ret` as the master's job cache holds it (what
        its key sent: tasks/salt/jobs.py). Raises on no answer or retcode != 0.
        `gather_job_timeout`: how long the master asks a silent minion whether the job still
        runs, after `timeout` (default: its config's, 10 s)."""
        with external(_system_of(fun)), self._master_call(f"{fun} for {minion_id}"):
            result = run_job(self._local(), minion_id, fun, list(arg), timeout=timeout,
                             kwarg=kwarg, gather_job_timeout=gather_job_timeout)
        if minion_id not in result:
            self.close()  # a silent target may mean a stale connection (master restart): renew
            raise SaltMinionNoResponse(minion_id, fun, timeout)
        ret = result[minion_id]
        retcode = int(ret.get("retcode", 0) or 0)
        if retcode != 0:
            raise SaltCommandFailed(minion_id, fun, retcode, summarize_failure(ret.get("ret")))
        return ret.get("ret")

    def cmd_multi(self, minion_id: str, calls: list[tuple[str, list[Any]]],
                  timeout: float = 60) -> dict[str, Any]:
        """Several functions in one job (Salt's compound command), each with its args:
        {fun: ret}, or {fun: SaltCommandFailed} for one that failed or is not on the minion.
        Raises when the minion does not answer."""
        funs = [fun for fun, _ in calls]
        if len(set(funs)) != len(funs):
            raise ValueError(f"cmd_multi: each function once, got {funs}")
        what = f"{'+'.join(funs)} for {minion_id}"
        with external(_system_of(funs[0])), self._master_call(what):
            result = run_job(self._local(), minion_id, funs, [list(args) for _, args in calls],
                             timeout=timeout)
        if minion_id not in result:
            self.close()
            raise SaltMinionNoResponse(minion_id, "+".join(funs), timeout)
        rets, retcodes = result[minion_id].get("ret"), result[minion_id].get("retcode")
        rets = rets if isinstance(rets, dict) else {}
        retcodes = retcodes if isinstance(retcodes, dict) else {}
        answers: dict[str, Any] = {}
        for fun in funs:
            retcode = retcodes.get(fun)  # absent: the function raised (or is not there)
            answers[fun] = rets.get(fun) if retcode == 0 else SaltCommandFailed(
                minion_id, fun, int(retcode or 1), summarize_failure(rets.get(fun)))
        return answers

    def extension_hashes(self) -> tuple[str, dict[str, str]]:
        """The master's hash_type and `extensions.served_extension_hashes` (its file server,
        built once per client)."""
        if self._fileserver is None:
            import salt.fileserver

            self._fileserver = salt.fileserver.Fileserver(self.opts)
        hash_type = str(self.opts.get("hash_type") or "sha256")
        return hash_type, served_extension_hashes(self._fileserver, hash_type)

    def cmd_many(self, minion_ids: list[str], fun: str, arg: list[Any] | tuple[Any, ...] = (),
                 kwarg: dict[str, Any] | None = None,
                 timeout: float = 10) -> dict[str, Any]:
        """One job for many minions (a list target); returns {minion: ret} for those that
        answered with retcode 0 and {minion: SaltCommandFailed} for those that failed. A minion
        that did not answer within `timeout` is absent."""
        if not minion_ids:
            return {}
        with external(_system_of(fun)), self._master_call(f"{fun} for {len(minion_ids)} minions"):
            result = run_job(self._local(), list(minion_ids), fun, list(arg), timeout=timeout,
                             tgt_type="list", kwarg=kwarg, gather_job_timeout=min(timeout, 2))
        answers: dict[str, Any] = {}
        for minion, ret in result.items():
            if minion not in minion_ids:
                continue
            retcode = int(ret.get("retcode", 0) or 0)
            answers[minion] = (ret.get("ret") if retcode == 0 else SaltCommandFailed(
                minion, fun, retcode, summarize_failure(ret.get("ret"))))
        return answers

    def job_return(self, jid: str, minion_id: str, wait: float = 5) -> dict[str, Any] | None:
        """What this minion's key returned for job `jid` (the job cache's), or None."""
        with self._master_call(f"job {jid} of {minion_id}"):
            return cached_return(self._local(), jid, minion_id, wait)

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
            with SALT_LOADING:
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

    def ping(self, minion_id: str, timeout: float = 5, gather_job_timeout: float = 2) -> bool:
        """Does it answer? A silent one costs timeout + gather_job_timeout (Salt's default: 10)."""
        try:
            return bool(self.cmd(minion_id, "test.ping", timeout=timeout,
                                 gather_job_timeout=gather_job_timeout))
        except SaltError:
            return False


_per_thread = threading.local()


def master_client(master_config: str | Path) -> SaltMasterClient:
    """The calling thread's client for this master: a rollout's steps run in one thread and
    share it, so Salt's clients are built once per rollout, not once per step."""
    clients: dict[str, SaltMasterClient] = _per_thread.__dict__.setdefault("clients", {})
    return clients.setdefault(str(master_config), SaltMasterClient(master_config))
