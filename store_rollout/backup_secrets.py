"""A store VM's backup secrets (issue 48), derived, never stored: the REST password it logs in
to the region's backup server with (its user is its minion id) and its restic repository's
password, each HMAC-SHA256 of the Backup Credentials Block's key over a purpose and the VM's
minion id. The orchestrator derives them to verify and prune a store's repository; the master's
ext_pillar (salt_states/_pillar/store_backup.py, which cannot import this package) derives the
same with its own copy of `derive`, pinned to this one by tests/unit/test_backup_secrets.py.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final
from urllib.parse import quote, urlsplit

REST_PASSWORD: Final = "rest-password"
REPOSITORY_PASSWORD: Final = "repository-password"
# whose backups these are: a store VM's minion id (`Store.vm_minion_id`), nothing else
STORE_VM_ID: Final = re.compile(r"store-[a-z0-9][a-z0-9-]{0,23}-vm")


def derive(key: str, minion_id: str, purpose: str) -> str:
    """The secret of `purpose` for the VM `minion_id`: hex HMAC-SHA256(key, purpose:minion_id)."""
    return hmac.new(key.encode(), f"{purpose}:{minion_id}".encode(), hashlib.sha256).hexdigest()


def is_store_vm(minion_id: str) -> bool:
    return STORE_VM_ID.fullmatch(minion_id) is not None


def repository_url(base_url: str, user: str, password: str, minion_id: str) -> str:
    """restic's `rest:` repository of `minion_id` on the server `base_url` (https://host:port),
    logged in as `user`: a secret (it holds the password), for restic's environment only."""
    parts = urlsplit(base_url.rstrip("/"))
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"backup URL {base_url!r}: expected https://host:port")
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.netloc}"
    return f"rest:https://{netloc}{parts.path}/{minion_id}/"
