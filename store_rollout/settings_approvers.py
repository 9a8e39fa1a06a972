"""When a run asks for an approval, who may give it, and where the audit trail goes: part of the settings
(store_rollout/settings.py). The setting names the Secret Block holding the approvers' seeds;
it never holds a seed itself (store_rollout/approvers.py)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from store_rollout.approval_policy import (
    DEFAULT_APPROVAL_POLICY,
    DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    ApprovalPolicy,
)
from store_rollout.audit import DEFAULT_AUDIT_DIR

DEFAULT_APPROVERS_BLOCK = "store-rollout-approvers"


class ApproverSettings(BaseSettings):
    # when a rollout asks a person first (a run may only tighten it: approvals.tightened), and
    # how long it waits paused before it is parked (store_rollout/approval_policy.py)
    approval_policy: ApprovalPolicy = DEFAULT_APPROVAL_POLICY
    approval_timeout_seconds: float = Field(DEFAULT_APPROVAL_TIMEOUT_SECONDS, gt=0, le=604800)
    approvers_block: str = Field(
        DEFAULT_APPROVERS_BLOCK, pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="name of the Prefect Secret Block holding the approvers' TOTP seeds (a "
                    'JSON map, e.g. {"ana": "<base32 seed>"})')
    audit_dir: str = Field(DEFAULT_AUDIT_DIR, description="directory of the audit trail (one "
                           "append-only 0600 JSONL file per store) and of the used codes")
