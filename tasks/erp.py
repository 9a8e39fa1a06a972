"""ERP notification over HTTP (requests), idempotent per store rollout.

One POST per call, explicit connect/read timeouts, no transport retries: the `notify_erp` task's
Prefect retries are the one retry layer (429/5xx and transport errors are `ErpUnavailable`; a
retried POST is safe because every notice carries an Idempotency-Key the ERP deduplicates on).
`ErpCredentials` is a Prefect Block; `erp_client()` is where tasks get the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests
from prefect import get_run_logger, task
from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from store_rollout import step_rules
from store_rollout.contracts import (
    ERP_STORE_DECOMMISSIONED,
    ERP_STORE_HARDWARE_REPLACED,
    ERP_STORE_IMAGE_UPDATED,
    ERP_STORE_SERVER_RUNNING,
)
from store_rollout.instrument import external
from store_rollout.inventory import Store
from store_rollout.settings_parts import ErpSettings
from store_rollout.transport import checked_url
from store_rollout.updates import update_notice_key
from tasks.blocks import load_block, secret_of
from tasks.retry import ERP_RETRY, OutsideCallFailed
from tasks.transport import outside_url

ERP_CONNECT_TIMEOUT = 3.05
ERP_TIMEOUT = (ERP_CONNECT_TIMEOUT, 15.0)  # (connect, read) seconds: never wait forever
NOTICE_PATH = "/api/v1/store-rollouts"


class ErpError(OutsideCallFailed):
    """The ERP call failed: `operation` ("POST" a notice, "GET" the notices), the store it was
    for (`subject`) and, when the ERP answered, the HTTP `status`."""


class ErpUnavailable(ErpError):
    """The ERP did not answer, or answered 429 or 5xx: worth retrying."""


class ErpRejected(ErpError):
    """The ERP answered another 4xx: the notice or the credentials are wrong (not retried)."""


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
        return step_rules.erp_idempotency_key(self.store_id, self.vm_uuid)

    def payload(self) -> dict[str, Any]:
        return {"store_id": self.store_id, "site_code": self.site_code,
                "cost_center": self.cost_center, "hypervisor": self.hypervisor,
                "vm": {"domain": self.vm_domain, "minion": self.vm_minion, "uuid": self.vm_uuid},
                "status": ERP_STORE_SERVER_RUNNING}


@dataclass(frozen=True)
class BoxNotice:
    """About the store's box: closed (`ERP_STORE_DECOMMISSIONED`: its server and host are gone
    from every system we drive) or replaced (`ERP_STORE_HARDWARE_REPLACED`: the store runs on
    the box `hardware` describes, no longer on `old_mac`'s)."""

    store_id: str
    site_code: str
    hypervisor: str
    hypervisor_mac: str
    status: str = ERP_STORE_DECOMMISSIONED
    hardware: dict[str, Any] | None = None
    old_mac: str | None = None

    def idempotency_key(self) -> str:
        return step_rules.box_notice_key(self.store_id, self.status, self.hypervisor_mac)

    def payload(self) -> dict[str, Any]:
        replaced = ({"hardware": self.hardware, "old_hardware": {"mac": self.old_mac}}
                    if self.status == ERP_STORE_HARDWARE_REPLACED else {})
        return {"store_id": self.store_id, "site_code": self.site_code,
                "hypervisor": self.hypervisor, "status": self.status, **replaced}


@dataclass(frozen=True)
class UpdateNotice:
    """The store server runs image `version` (`ERP_STORE_IMAGE_UPDATED`), after an update
    whose checks passed: one per store and version, so a rerun replays it."""

    store_id: str
    site_code: str
    vm: dict[str, str]  # domain, minion, uuid
    version: str
    from_version: str
    image_key: str

    def idempotency_key(self) -> str:
        return update_notice_key(self.store_id, self.version)

    def payload(self) -> dict[str, Any]:
        return {"store_id": self.store_id, "site_code": self.site_code, "vm": self.vm,
                "status": ERP_STORE_IMAGE_UPDATED,
                "image": {"version": self.version, "from_version": self.from_version,
                          "key": self.image_key}}


class ErpClient:
    """Keyword-only, explicit timeouts; one POST per `notify` (retrying is the task's job)."""

    def __init__(self, *, base_url: str, token: SecretStr,
                 timeout: tuple[float, float] = ERP_TIMEOUT, insecure_http: bool = False,
                 ca_bundle: str = "") -> None:
        self.base_url = checked_url(base_url, "erp", "erp_url", insecure_http).rstrip("/")
        self.timeout = timeout
        self._token = token
        self.session = requests.Session()  # requests' default adapter: no retries
        self.session.verify = ca_bundle or True

    def __repr__(self) -> str:
        return f"ErpClient(base_url={self.base_url!r})"

    def close(self) -> None:
        self.session.close()

    def notify(self, notice: ErpNotice | BoxNotice | UpdateNotice) -> dict[str, Any]:
        url = self.base_url + NOTICE_PATH
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}",
                   "Idempotency-Key": notice.idempotency_key()}
        try:
            with external("erp"):
                resp = self.session.post(url, json=notice.payload(), headers=headers,
                                         timeout=self.timeout)
        except requests.RequestException as exc:
            raise ErpUnavailable(f"ERP POST {url} for store {notice.store_id} failed: "
                                 f"{type(exc).__name__}", operation="POST",
                                 subject=notice.store_id) from None
        self._check_status(resp, "POST", url, notice.store_id)
        try:
            body = resp.json()
            erp_id = body["id"]
        except (ValueError, TypeError, KeyError):  # JSONDecodeError is a ValueError
            raise ErpError(f"ERP POST {url} for store {notice.store_id}: HTTP {resp.status_code} "
                           f"without a JSON object with an id: {self._redact(resp.text)[:100]!r}",
                           operation="POST", subject=notice.store_id,
                           status=resp.status_code) from None
        return {"erp_id": erp_id, "replay": bool(body.get("replay")),
                "status": resp.status_code, "idempotency_key": notice.idempotency_key()}

    def notices(self, store_id: str) -> list[dict[str, Any]]:
        """The notices the ERP holds for a store, oldest first: [{id, idempotency_key, vm_uuid,
        received}] (a read: plan and reconcile use it)."""
        url = self.base_url + NOTICE_PATH
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"}
        try:
            with external("erp"):
                resp = self.session.get(url, params={"store_id": store_id}, headers=headers,
                                        timeout=self.timeout)
        except requests.RequestException as exc:
            raise ErpUnavailable(f"ERP GET {url} for store {store_id} failed: "
                                 f"{type(exc).__name__}", operation="GET",
                                 subject=store_id) from None
        self._check_status(resp, "GET", url, store_id)
        try:
            notices = resp.json()["notices"]
        except (ValueError, TypeError, KeyError):
            raise ErpError(f"ERP GET {url} for store {store_id}: HTTP {resp.status_code} without "
                           f"a JSON object with notices: {self._redact(resp.text)[:100]!r}",
                           operation="GET", subject=store_id, status=resp.status_code) from None
        return [dict(n) for n in notices]

    def _check_status(self, resp: requests.Response, operation: str, url: str,
                      store_id: str) -> None:
        """429 and 5xx: ErpUnavailable (busy, worth retrying); another 4xx: ErpRejected."""
        status = resp.status_code
        if status >= 500 or status == 429:
            raise ErpUnavailable(f"ERP {operation} {url} for store {store_id}: HTTP {status}",
                                 operation=operation, subject=store_id, status=status)
        if status >= 400:
            raise ErpRejected(f"ERP {operation} {url} for store {store_id}: HTTP {status} "
                              f"{self._redact(resp.text)[:200]}",
                              operation=operation, subject=store_id, status=status)

    def _redact(self, text: str) -> str:
        """An ERP body quoted in an error, without our token should the ERP echo it."""
        token = self._token.get_secret_value()
        return text.replace(token, "**********") if token else text


class ErpCredentials(CredentialsBlock):
    """The ERP API and its bearer token (`STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK=<name>`)."""

    _block_type_name = "ERP Credentials"

    base_url: str = Field(title="Base URL", description="Root URL of the ERP API.")
    token: SecretStr = Field(title="Token", description="API bearer token; never logged.")
    timeout_seconds: float = Field(default=ERP_TIMEOUT[1], gt=0, le=300, title="Read timeout",
                                   description="Seconds the ERP may take to answer.")

    def get_client(self, insecure_http: bool = False, ca_bundle: str = "") -> ErpClient:
        """`insecure_http`, `ca_bundle`: the settings' insecure_erp_http, erp_ca_bundle."""
        return ErpClient(base_url=self.base_url, token=self.token,
                         timeout=(ERP_CONNECT_TIMEOUT, self.timeout_seconds),
                         insecure_http=insecure_http, ca_bundle=ca_bundle)


def erp_client(settings: ErpSettings) -> ErpClient:
    """The ERP client every task uses: from the Block STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK names,
    else from the erp_* settings and the Secret block STORE_ROLLOUT_ERP_TOKEN_BLOCK names (the
    token is never a setting)."""
    if settings.erp_credentials_block:
        credentials = load_block(ErpCredentials, settings.erp_credentials_block)
        field = f"the base_url of the ERP Credentials Block {settings.erp_credentials_block!r}"
    else:
        credentials = ErpCredentials(
            base_url=settings.erp_url,
            token=secret_of(settings.erp_token_block, "STORE_ROLLOUT_ERP_TOKEN_BLOCK"),
            timeout_seconds=settings.erp_timeout_seconds)
        field = "STORE_ROLLOUT_ERP_URL"
    outside_url(credentials.base_url, "erp", field, settings.insecure_erp_http)
    return credentials.get_client(settings.insecure_erp_http, settings.erp_ca_bundle)


@task(name="notify_erp", **ERP_RETRY.on(ErpUnavailable))
def notify_erp(store: Store, vm: dict[str, Any], erp: ErpSettings) -> dict[str, Any]:
    """Step 7: tell the ERP the store server runs; returns the ERP's id for the run artifact."""
    logger = get_run_logger()
    client = erp_client(erp)
    notice = ErpNotice(store_id=store.store_id, site_code=store.erp.site_code,
                       cost_center=store.erp.cost_center, hypervisor=store.hypervisor_minion_id,
                       vm_domain=vm["domain"], vm_minion=store.vm_minion_id, vm_uuid=vm["uuid"])
    result = client.notify(notice)
    logger.info("store %s: ERP notified, id %s%s", store.store_id, result["erp_id"],
                " (replayed)" if result["replay"] else "")
    return result


@task(name="notify_erp_decommissioned", task_run_name="notify-erp-decommissioned-{store.store_id}",
      **ERP_RETRY.on(ErpUnavailable))
def notify_erp_decommissioned(store: Store, erp: ErpSettings) -> dict[str, Any]:
    """Decommission: tell the ERP the store is closed (a rerun replays the same notice)."""
    result = erp_client(erp).notify(BoxNotice(
        store_id=store.store_id, site_code=store.erp.site_code,
        hypervisor=store.hypervisor_minion_id, hypervisor_mac=store.hypervisor.mac))
    get_run_logger().info("store %s: ERP told of the decommission, id %s%s", store.store_id,
                          result["erp_id"], " (replayed)" if result["replay"] else "")
    return result


@task(name="notify_erp_replaced", task_run_name="notify-erp-replaced-{store.store_id}",
      **ERP_RETRY.on(ErpUnavailable))
def notify_erp_replaced(store: Store, old_mac: str, erp: ErpSettings) -> dict[str, Any]:
    """Replacement, after step 7: tell the ERP the store runs on a new box (a rerun replays)."""
    hv = store.hypervisor
    hardware = {"mac": hv.mac, "serial": hv.serial, "power_type": hv.power_type,
                "power_address": hv.power_address}
    result = erp_client(erp).notify(BoxNotice(
        store_id=store.store_id, site_code=store.erp.site_code,
        hypervisor=store.hypervisor_minion_id, hypervisor_mac=hv.mac,
        status=ERP_STORE_HARDWARE_REPLACED, hardware=hardware, old_mac=old_mac))
    get_run_logger().info("store %s: ERP told of the new box %s, id %s%s", store.store_id,
                          hv.mac, result["erp_id"], " (replayed)" if result["replay"] else "")
    return result


@task(name="notify_erp_image_updated", task_run_name="notify-erp-updated-{store.store_id}",
      **ERP_RETRY.on(ErpUnavailable))
def notify_erp_image_updated(store: Store, vm: dict[str, Any], version: str, from_version: str,
                             image_key: str, erp: ErpSettings) -> dict[str, Any]:
    """An image update passed its checks: tell the ERP the store runs `version` (once per store
    and version: a rerun replays the same notice)."""
    result = erp_client(erp).notify(UpdateNotice(
        store_id=store.store_id, site_code=store.erp.site_code, version=version,
        from_version=from_version, image_key=image_key,
        vm={"domain": store.vm_name, "minion": store.vm_minion_id, "uuid": vm.get("uuid", "")}))
    get_run_logger().info("store %s: ERP told it runs image version %s, id %s%s",
                          store.store_id, version, result["erp_id"],
                          " (replayed)" if result["replay"] else "")
    return result
