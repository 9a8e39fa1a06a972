"""Backups of the store VMs' data disks (issue 48): the region's backup target and the retention.
Part of the settings (store_rollout/settings.py)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from store_rollout.settings_parts import _Part


class BackupSettings(BaseSettings):
    # the region's restic REST server (empty: no backups are configured; a backup run refuses
    # naming this setting)
    backup_url: str = Field("", description="the region's restic REST server, "
                            "https://host:port (each store's repository is <url>/<vm minion id>)")
    backup_ca_file: str = Field("", description="CA bundle that verifies the backup server's TLS")
    backup_credentials_block: str = Field(
        "store-rollout-backup", pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="name of the Backup Credentials Block (the key the stores' repository "
                    "passwords derive from, and the server's admin login)")
    backup_keep_daily: int = Field(7, ge=1, description="daily snapshots kept per store")
    backup_keep_weekly: int = Field(4, ge=0, description="weekly snapshots kept per store")
    backup_max_age_hours: float = Field(
        48, gt=0, description="reconcile flags a store whose newest good backup is older")


class BackupPart(_Part):
    """What the backup tasks use."""
    backup_url: str
    backup_ca_file: str
    backup_credentials_block: str
    backup_keep_daily: int
    backup_keep_weekly: int
    backup_max_age_hours: float
