"""ERP notification over HTTP (requests), idempotent per store rollout.

A `requests.Session` with urllib3 `Retry` (backoff, 429/5xx, POST allowed because every notice
carries an Idempotency-Key the ERP deduplicates on) and explicit connect/read timeouts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import requests
from prefect import get_run_logger, task
from pydantic import SecretStr
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from store_rollout.instrument import external
from store_rollout.inventory import Store
from store_rollout.settings import load_settings
from tasks.retry import retry_on

ERP_TIMEOUT = (3.05, 15.0)  # (connect, read) seconds: never wait forever
NOTICE_PATH = "/api/v1/store-rollouts"


class ErpError(Exception):
    """The ERP call failed."""


class ErpUnavailable(ErpError):
    """The ERP did not answer or answered 5xx after the session's own retries."""


class ErpRejected(ErpError):
    """The ERP answered 4xx: the notice or the credentials are wrong (not retried)."""


@dataclass(frozen=True)
class ErpNotice:
    store_id: str
    site_code: str
    cost_center: str | None
    hypervisor: str
    vm_domain: str
    vm_minion: str
    vm_uuid: str

    def idempotency_key(self) -> str:
        """Same store + same VM instance -> same key, so a rerun never makes a second notice."""
        digest = hashlib.sha256(f"{self.store_id}/{self.vm_uuid}".encode()).hexdigest()[:32]
        return f"store-rollout-{self.store_id}-{digest}"

    def payload(self) -> dict[str, Any]:
        return {"store_id": self.store_id, "site_code": self.site_code,
                "cost_center": self.cost_center, "hypervisor": self.hypervisor,
                "vm": {"domain": self.vm_domain, "minion": self.vm_minion, "uuid": self.vm_uuid},
                "status": "store-server-running"}


class ErpClient:
    def __init__(self, *, base_url: str, token: SecretStr, timeout: tuple[float, float] = ERP_TIMEOUT,
                 total_retries: int = 5, backoff_factor: float = 0.5) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token = token
        retry = Retry(total=total_retries, connect=total_retries, read=total_retries,
                      status=total_retries, backoff_factor=backoff_factor,
                      status_forcelist=(429, 500, 502, 503, 504),
                      allowed_methods=frozenset({"GET", "POST"}), raise_on_status=False,
                      respect_retry_after_header=True)
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))

    def notify(self, notice: ErpNotice) -> dict[str, Any]:
        url = self.base_url + NOTICE_PATH
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}",
                   "Idempotency-Key": notice.idempotency_key()}
        try:
            with external("erp"):
                resp = self.session.post(url, json=notice.payload(), headers=headers,
                                         timeout=self.timeout)
        except requests.RequestException as exc:
            raise ErpUnavailable(f"ERP POST {url} for store {notice.store_id} failed: "
                                 f"{type(exc).__name__}") from None
        if resp.status_code >= 500 or resp.status_code == 429:  # 429: busy, worth retrying
            raise ErpUnavailable(f"ERP POST {url} for store {notice.store_id}: HTTP "
                                 f"{resp.status_code} after retries")
        if resp.status_code >= 400:
            raise ErpRejected(f"ERP POST {url} for store {notice.store_id}: HTTP "
                              f"{resp.status_code} {self._redact(resp.text)[:200]}")
        try:
            body = resp.json()
            erp_id = body["id"]
        except (ValueError, TypeError, KeyError):  # JSONDecodeError is a ValueError
            raise ErpError(f"ERP POST {url} for store {notice.store_id}: HTTP {resp.status_code} "
                           f"without a JSON object with an id: {self._redact(resp.text)[:100]!r}") from None
        return {"erp_id": erp_id, "replay": bool(body.get("replay")),
                "status": resp.status_code, "idempotency_key": notice.idempotency_key()}

    def _redact(self, text: str) -> str:
        """An ERP body quoted in an error, without our token should the ERP echo it."""
        token = self._token.get_secret_value()
        return text.replace(token, "**********") if token else text


@task(name="notify_erp", task_run_name="notify-erp-{store.store_id}",
      retries=3, retry_delay_seconds=[5, 15, 30], retry_condition_fn=retry_on(ErpUnavailable))
def notify_erp(store: Store, vm: dict[str, Any]) -> dict[str, Any]:
    """Step 7: tell the ERP the store server runs; returns the ERP's id for the run artifact."""
    logger = get_run_logger()
    settings = load_settings()
    client = ErpClient(base_url=settings.erp_url, token=settings.erp_token,
                       timeout=(3.05, settings.erp_timeout_seconds))
    notice = ErpNotice(store_id=store.store_id, site_code=store.erp.site_code,
                       cost_center=store.erp.cost_center, hypervisor=store.hypervisor_minion_id,
                       vm_domain=vm["domain"], vm_minion=store.vm_minion_id, vm_uuid=vm["uuid"])
    result = client.notify(notice)
    logger.info("store %s: ERP notified, id %s%s", store.store_id, result["erp_id"],
                " (replayed)" if result["replay"] else "")
    return result
