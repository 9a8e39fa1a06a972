"""The clients' side of store_rollout/transport.py: an outside system's URL checked before
its client is built, and plain HTTP that a setting lets through logged as a warning each time."""

from __future__ import annotations

import logging

from store_rollout.transport import checked_url, insecure_setting, plain_http


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("store_rollout.transport")


def outside_url(url: str, system: str, field: str, insecure: bool) -> str:
    """`url` when https://, on the loopback, or let through by `insecure` (then a warning
    saying so); else ValueError naming `field` and the fix."""
    checked_url(url, system, field, insecure)
    if plain_http(url):
        _logger().warning("%s at %s over plain HTTP, as %s=true allows: its credentials cross "
                          "the network in clear (a test setup only)", system, url,
                          insecure_setting(system))
    return url
