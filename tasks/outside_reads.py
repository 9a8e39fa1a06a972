"""Each store's Cobbler record and ERP notices for `plan` and `reconcile` (tasks/observe.py),
read a few stores at a time: one store after another, a 1,000-store region is 2,000 requests
in a row, each waiting on its answer's round trip.

Each reading thread has its own clients (an XML-RPC proxy holds one connection and is not safe
to share) and runs in a copy of the caller's context, where Prefect's settings (the API the
Secret blocks come from) live."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from store_rollout.inventory import Store
from store_rollout.settings_parts import CobblerSettings, ErpSettings, HostSettings, SaltSettings
from tasks.cobbler import CobblerError, cobbler_client, system_changes, system_spec
from tasks.erp import ErpError, erp_client

# requests in flight to Cobbler and the ERP together; small next to either server's capacity
READS_AT_ONCE = 8


@dataclass(frozen=True)
class OutsideFacts:
    """What Cobbler and the ERP say of one store."""

    record: dict[str, Any] | None
    changes: list[str]
    notices: list[dict[str, Any]]
    erp_error: str | None


def read_outside(stores: list[Store], cobbler: CobblerSettings, erp: ErpSettings,
                 salt: SaltSettings, hosts: HostSettings) -> dict[str, OutsideFacts]:
    """{store id: its OutsideFacts}. A Cobbler error fails the read naming the store (Cobbler
    is the install's truth); an ERP error is kept as that store's `erp_error`."""
    local = threading.local()
    opened: list[tuple[Any, Any]] = []  # every thread's clients, closed when the pool is done
    failed = threading.Event()  # the first Cobbler failure stops the stores not yet read

    def one(store: Store) -> OutsideFacts | None:
        if failed.is_set():
            return None
        try:
            if not hasattr(local, "clients"):
                local.clients = (cobbler_client(cobbler), erp_client(erp))
                opened.append(local.clients)
            records, notices_of = local.clients
            record = records.get_system(store.cobbler_system)
            changes = [c.describe() for c in system_changes(
                system_spec(store, salt, hosts, token=""), record)]
        except CobblerError as exc:
            failed.set()
            raise CobblerError(f"store {store.store_id}: reading Cobbler system "
                               f"{store.cobbler_system}: {exc}") from exc
        except Exception:  # no client (a Block missing): as soon, and once
            failed.set()
            raise
        try:
            return OutsideFacts(record, changes, notices_of.notices(store.store_id), None)
        except ErpError as exc:
            return OutsideFacts(record, changes, [], str(exc))

    caller = contextvars.copy_context()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(READS_AT_ONCE, len(stores)))) as pool:
            futures = [pool.submit(caller.copy().run, one, store) for store in stores]
            # the first failure in the stores' order; the others return at once once it is set
            found = [future.result() for future in futures]
    finally:
        for clients in opened:
            for client in clients:
                client.close()
    return {store.store_id: facts for store, facts in zip(stores, found, strict=True)
            if facts is not None}
