"""A job's answers as the master's job cache holds them, never as the event bus shows them.

Any accepted minion can fire `salt/job/<jid>/ret/<another id>` on the master's bus (a batch
`_minion_event` is fired as the minion wrote it, and every minion sees the publications, so it
knows the jid: ../shared/notes/security.md), and Salt's LocalClient keeps the first return it
sees for a minion. The job cache is written only by the master's `_return`, under the id the
request server authenticated: so the bus only says *when* to look, and the cache says *what*
each minion answered. A bus return the cache does not confirm is reported as forged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tasks.salt.errors import SaltError

log = logging.getLogger(__name__)
# the cache is written right after the master fires the return event; a confirmation that has
# not landed after this long came from a forged event (or the real answer is still due)
CACHE_POLL_SECONDS = 0.05


def warn_forged(message: str) -> None:
    """The run's log when there is a run (the rollout names the attempt), else this logger."""
    try:
        from prefect.logging import get_run_logger

        get_run_logger().warning(message)
    except Exception:  # noqa: BLE001 (MissingContextError outside a flow or task run)
        log.warning(message)


def cached_returns(local: Any, jid: str) -> dict[str, dict[str, Any]]:
    """{minion: {"return", "retcode"?}} of a job, from the master's job cache."""
    opts = local.opts
    if not opts.get("job_cache", True):
        raise SaltError("the Salt master keeps no job cache (job_cache: False): answers can only "
                        "be read from the bus, where any minion can forge them; set job_cache: "
                        "True", operation="job cache")
    return dict(local.returners[f"{opts['master_job_cache']}.get_jid"](jid) or {})


def run_job(local: Any, tgt: str | list[str], fun: str | list[str], arg: list[Any], *,
            tgt_type: str = "glob", kwarg: dict[str, Any] | None = None, timeout: float,
            gather_job_timeout: float | None = None,
            warn: Callable[[str], None] = warn_forged) -> dict[str, dict[str, Any]]:
    """Publish one job and return {minion: {"ret", "retcode"}} for each minion whose answer
    the job cache holds within `timeout`; a minion that did not answer is absent."""
    started = time.monotonic()
    extra = {} if gather_job_timeout is None else {"gather_job_timeout": gather_job_timeout}
    was_listening = local.event.cpub
    try:
        pub = local.run_job(tgt, fun, arg, tgt_type, "", int(timeout), kwarg=kwarg,
                            listen=True, **extra)
        if not pub:
            return {}
        jid = str(pub["jid"])
        on_bus: dict[str, Any] = {}
        for answer in local.get_cli_event_returns(jid, pub["minions"], int(timeout), tgt,
                                                  tgt_type, **extra):
            for minion, data in (answer or {}).items():
                if isinstance(data, dict) and data.get("out") != "no_return":
                    on_bus.setdefault(minion, data)
    finally:
        if not was_listening:
            local.event.close_pub()
    return _confirmed(local, jid, on_bus, started + timeout, warn)


def _confirmed(local: Any, jid: str, on_bus: dict[str, Any], deadline: float,
               warn: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The answers of the minions the bus named, as the cache holds them (waiting for it up
    to `deadline`: the real answer may come after a forged one)."""
    cached = cached_returns(local, jid)
    while set(on_bus) - set(cached) and time.monotonic() < deadline:
        time.sleep(CACHE_POLL_SECONDS)
        cached = cached_returns(local, jid)
    answers: dict[str, dict[str, Any]] = {}
    for minion, seen in on_bus.items():
        if minion not in cached:
            warn(f"Salt job {jid}: a return claiming to be {minion}'s was seen on the master's "
                 "bus, but the master's job cache holds none from that minion's key: forged by "
                 "another minion and ignored")
            continue
        held = cached[minion]
        if seen.get("ret") != held.get("return"):
            warn(f"Salt job {jid}: a return claiming to be {minion}'s on the master's bus "
                 "differs from the one its key sent (the job cache's): the bus one was forged "
                 "by another minion and is ignored")
        answers[minion] = {"ret": held.get("return"), "retcode": held.get("retcode", 0)}
    return answers


def cached_return(local: Any, jid: str, minion: str, wait: float) -> dict[str, Any] | None:
    """What `minion`'s key returned for job `jid` ({"return", "retcode"?}), waiting up to
    `wait` seconds for the cache; None: nothing came from that minion."""
    deadline = time.monotonic() + wait
    while True:
        held = cached_returns(local, jid).get(minion)
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(CACHE_POLL_SECONDS)
