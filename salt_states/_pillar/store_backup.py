"""Master ext_pillar: a store VM's own backup credentials, by the minion id the master
authenticated (never a call's argument: every minion receives every publication).

For `store-<id>-vm` only (nothing for a hypervisor or any other minion):

    store_backup:
      url: https://backup.region.example:8443   # the region's restic REST server
      user: store-0001-vm                       # the VM's REST login and repository name
      rest_password: <hex>                      # HMAC-SHA256(key, "rest-password:<id>")
      repository_password: <hex>                # HMAC-SHA256(key, "repository-password:<id>")
      ca_pem: <the CA bundle that verifies the server>

Master config:

    extension_modules / pillar_dirs: where this file is (saltutil.sync_pillar copies
      salt://_pillar there)
    ext_pillar:
      - store_backup: {key_file: /etc/salt/store-backup.key, url: https://..., ca_file: ...}

`key_file` holds the Backup Credentials Block's key and must be the master user's alone
(mode 0600): one readable by others gives no pillar. The derivation is
store_rollout/backup_secrets.py `derive`, copied here (the master imports nothing of the
orchestrator) and pinned to it by a test. Runs under the master's Python (3.6 and later).
"""

import hashlib
import hmac
import logging
import os
import re
import stat

log = logging.getLogger(__name__)

__virtualname__ = "store_backup"

STORE_VM_ID = re.compile(r"store-[a-z0-9][a-z0-9-]{0,23}-vm\Z")


def __virtual__():
    return __virtualname__


def derive(key, minion_id, purpose):
    """store_rollout/backup_secrets.py `derive`, the same bytes in, the same hex out."""
    message = "{}:{}".format(purpose, minion_id).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def _private_text(path):
    """The stripped text of `path` when only its owner may read it, else None (logged)."""
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.error("store_backup: %s is readable by others (mode %o): chmod 600 it", path,
                      stat.S_IMODE(mode))
            return None
        with open(path) as handle:
            return handle.read().strip() or None
    except (IOError, OSError) as exc:
        log.error("store_backup: cannot read %s: %s", path, exc)
        return None


def ext_pillar(minion_id, pillar, key_file="", url="", ca_file=""):  # pylint: disable=unused-argument
    if not STORE_VM_ID.match(minion_id) or not key_file or not url:
        return {}
    key = _private_text(key_file)
    if key is None:
        return {}
    ca_pem = ""
    if ca_file:
        with open(ca_file) as handle:
            ca_pem = handle.read()
    return {"store_backup": {
        "url": url, "user": minion_id, "ca_pem": ca_pem,
        "rest_password": derive(key, minion_id, "rest-password"),
        "repository_password": derive(key, minion_id, "repository-password")}}
