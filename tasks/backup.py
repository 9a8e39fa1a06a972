"""The region's backup server (issue 48), the orchestrator's side: the Backup Credentials Block
(the key each store's secrets derive from: store_rollout/backup_secrets.py, and the server's
admin login) and a thin client over the restic CLI for the admin endpoint (not append-only:
verification and retention), with typed errors. The stores back up through their own minion
(salt_states/_modules/storebackup.py); this side never writes a store's data.

Each store VM's repository is `<admin url>/<vm minion id>/`; its password is derived, never
stored. restic gets the repository and password in its environment only: no command line, log
line, error or artifact holds them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from datetime import UTC, datetime
from typing import Any, Final

import requests
from prefect import task
from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from store_rollout.backup_secrets import REPOSITORY_PASSWORD, derive, repository_url
from store_rollout.settings_backup import BackupPart
from tasks.blocks import load_block
from tasks.retry import BACKUP_RETRY, OutsideCallFailed

RESTIC_TIMEOUT: Final = 3600.0  # seconds one admin call (a check, a prune) may take
TAG: Final = "store-rollout"  # what storebackup.run tags its snapshots with


class BackupError(OutsideCallFailed):
    """A call to the backup server failed for good (bad login, a damaged repository)."""


class BackupUnavailable(BackupError):
    """The backup server did not answer, or answered 5xx / a lock held by another restic:
    worth a retry."""


class BackupNotConfigured(ValueError):
    """The settings name no backup target (backup_url)."""


class BackupCredentials(CredentialsBlock):
    """The region backup server's secrets: the key the stores' REST and repository passwords
    derive from, and the admin endpoint's login (named by STORE_ROLLOUT_BACKUP_CREDENTIALS_BLOCK)."""

    _block_type_name = "Backup Credentials"

    key: SecretStr = Field(title="Key", description="the key the stores' backup passwords "
                           "derive from (also in the master's ext_pillar key file); never logged")
    admin_url: str = Field(title="Admin URL", description="the server's admin endpoint, "
                           "https://host:port (not append-only; the orchestrator's only)")
    admin_user: str = Field(title="Admin user", description="the admin endpoint's login")
    admin_password: SecretStr = Field(title="Admin password", description="never logged")

    def get_client(self, ca_file: str = "") -> ResticAdmin:
        return ResticAdmin(self.admin_url, self.admin_user, self.admin_password, self.key,
                           ca_file)


def backup_credentials(settings: BackupPart) -> BackupCredentials:
    if not settings.backup_url:
        raise BackupNotConfigured("backup_url is empty: no backup target is configured (set "
                                  "STORE_ROLLOUT_BACKUP_URL to the region's restic REST server)")
    return load_block(BackupCredentials, settings.backup_credentials_block)


def backup_admin(settings: BackupPart) -> ResticAdmin:
    return backup_credentials(settings).get_client(settings.backup_ca_file)


def snapshot_time(text: str) -> datetime:
    """restic's RFC 3339 time (nanoseconds, any offset) as an aware datetime."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).astimezone(UTC)


def age_hours(snapshot: dict[str, Any], now: datetime | None = None) -> float:
    return round(((now or datetime.now(UTC)) - snapshot_time(snapshot["time"]))
                 .total_seconds() / 3600, 4)


class ResticAdmin:
    """restic against the admin endpoint, one store VM's repository a call."""

    def __init__(self, url: str, user: str, password: SecretStr, key: SecretStr,
                 ca_file: str = "", timeout: float = RESTIC_TIMEOUT) -> None:
        self.url, self.user, self.ca_file, self.timeout = url.rstrip("/"), user, ca_file, timeout
        self._password, self._key = password, key

    def _secrets(self, minion_id: str) -> tuple[str, str]:
        return (self._password.get_secret_value(),
                derive(self._key.get_secret_value(), minion_id, REPOSITORY_PASSWORD))

    def _scrub(self, text: str, minion_id: str) -> str:
        for secret in self._secrets(minion_id):
            text = text.replace(secret, "***")
        return text

    def exists(self, minion_id: str) -> bool:
        """Whether the VM has a repository (its first backup made it): the REST protocol's
        HEAD /<repo>/config."""
        try:
            answer = requests.head(f"{self.url}/{minion_id}/config", timeout=30,
                                   auth=(self.user, self._password.get_secret_value()),
                                   verify=self.ca_file or True)
        except requests.RequestException as exc:
            raise BackupUnavailable(f"backup server {self.url}: {exc}", operation="HEAD config",
                                    subject=minion_id) from exc
        if answer.status_code >= 500:
            raise BackupUnavailable(f"backup server {self.url}: HTTP {answer.status_code}",
                                    operation="HEAD config", subject=minion_id,
                                    status=answer.status_code)
        if answer.status_code in (401, 403):
            raise BackupError(f"backup server {self.url} refused the admin login "
                              f"(HTTP {answer.status_code}): check the Backup Credentials Block",
                              operation="HEAD config", subject=minion_id,
                              status=answer.status_code)
        if answer.status_code not in (200, 404):
            # only a 404 says "no repository": anything else (a redirect, a wrong path, a
            # throttle) is not taken for it, or a replacement would start with an empty disk
            raise BackupError(f"backup server {self.url}: HTTP {answer.status_code} for "
                              f"{minion_id}'s repository (200 or 404 expected): check backup_url "
                              "and the Block's admin_url", operation="HEAD config",
                              subject=minion_id, status=answer.status_code)
        return answer.status_code == 200

    def restic(self, minion_id: str, *args: str) -> str:
        """restic `args` on the VM's repository; its stdout. BackupUnavailable when the server
        is unreachable or the repository locked, BackupError otherwise."""
        admin, repository_password = self._secrets(minion_id)
        cache = os.path.join(tempfile.gettempdir(), f"store-rollout-restic-{os.getuid()}")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cache,
               "RESTIC_REPOSITORY": repository_url(self.url, self.user, admin, minion_id),
               "RESTIC_PASSWORD": repository_password}
        argv = ["restic", "--no-cache", *(["--cacert", self.ca_file] if self.ca_file else []),
                *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False,
                                  timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackupUnavailable(f"restic {args[0]} for {minion_id}: {exc}",
                                    operation=args[0], subject=minion_id) from exc
        if done.returncode != 0:
            said = self._scrub(done.stderr.strip(), minion_id)[-600:]
            transient = re.search(r"connection refused|timeout|502|503|504|already locked",
                                  said, re.IGNORECASE)
            raise (BackupUnavailable if transient else BackupError)(
                f"restic {args[0]} for {minion_id} failed: {said}", operation=args[0],
                subject=minion_id)
        return done.stdout

    def snapshots(self, minion_id: str) -> list[dict[str, Any]]:
        """The VM's snapshots made by its backups, oldest first ([] without a repository)."""
        if not self.exists(minion_id):
            return []
        listed = json.loads(self.restic(minion_id, "snapshots", "--json", "--tag", TAG)
                            or "[]") or []
        return sorted(({key: snap.get(key) for key in ("id", "short_id", "time", "hostname")}
                       for snap in listed), key=lambda snap: snapshot_time(snap["time"]))

    def check(self, minion_id: str) -> dict[str, Any]:
        """`restic check` of the VM's repository (its structure and indexes)."""
        said = self.restic(minion_id, "check")
        return {"ok": True, "summary": said.strip().splitlines()[-1:] or [""]}

    def forget(self, minion_id: str, keep_daily: int, keep_weekly: int) -> dict[str, Any]:
        """Retention: keep the newest of each of `keep_daily` days and `keep_weekly` weeks,
        forget the others and prune their data. {"kept": [ids], "removed": [ids]}."""
        said = self.restic(minion_id, "forget", "--json", "--prune", "--tag", TAG,
                           "--keep-daily", str(keep_daily), "--keep-weekly", str(keep_weekly))
        groups = json.loads(said.splitlines()[0] if said.strip() else "[]") or []
        return {"kept": [s["id"] for g in groups for s in g.get("keep") or []],
                "removed": [s["id"] for g in groups for s in g.get("remove") or []]}


def last_backup(admin: ResticAdmin, minion_id: str) -> dict[str, Any] | None:
    """The VM's newest snapshot {"id", "short_id", "time", "age_hours"}, or None."""
    found = admin.snapshots(minion_id)
    if not found:
        return None
    newest = found[-1]
    return {"id": newest["id"], "short_id": newest["short_id"], "time": newest["time"],
            "age_hours": age_hours(newest)}


@task(name="backup_snapshots", task_run_name="backup-snapshots-{minion_id}",
      **BACKUP_RETRY.on(BackupUnavailable))
def list_snapshots(minion_id: str, settings: BackupPart) -> list[dict[str, Any]]:
    """The VM's snapshots as the admin endpoint lists them, oldest first."""
    return backup_admin(settings).snapshots(minion_id)


@task(name="backup_check", task_run_name="backup-check-{minion_id}",
      **BACKUP_RETRY.on(BackupUnavailable))
def check_repository(minion_id: str, settings: BackupPart) -> dict[str, Any]:
    """`restic check` of the VM's repository; BackupError when it finds damage."""
    return backup_admin(settings).check(minion_id)


@task(name="backup_retention", task_run_name="backup-retention-{minion_id}",
      **BACKUP_RETRY.on(BackupUnavailable))
def apply_retention(minion_id: str, settings: BackupPart) -> dict[str, Any]:
    """`restic forget --prune` with the settings' backup_keep_daily and backup_keep_weekly."""
    return backup_admin(settings).forget(minion_id, settings.backup_keep_daily,
                                         settings.backup_keep_weekly)


def read_backups(minion_ids: list[str], settings: BackupPart) -> dict[str, dict[str, Any]]:
    """Per VM minion id, what plan and reconcile know of its backups (StoreFacts' fields
    backups_configured, last_backup, backup_error, backup_max_age_hours); nothing is read when
    backups are not configured, and a server that cannot be read is said, never taken for
    "no backup"."""
    base: dict[str, Any] = {"backups_configured": bool(settings.backup_url),
                            "backup_max_age_hours": settings.backup_max_age_hours}
    if not settings.backup_url or not minion_ids:
        return {minion: base for minion in minion_ids}
    try:
        admin = backup_admin(settings)
    except ValueError as exc:  # the Block is missing or malformed
        return {minion: {**base, "backup_error": str(exc)} for minion in minion_ids}
    found: dict[str, dict[str, Any]] = {}
    for minion in minion_ids:
        try:
            found[minion] = {**base, "last_backup": last_backup(admin, minion)}
        except BackupError as exc:
            found[minion] = {**base, "backup_error": str(exc)}
    return found
