"""Pure readings of Salt's answers: minion ids, key lists, state returns."""

from __future__ import annotations

import re
from typing import Any

MINION_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def check_minion_id(minion_id: str) -> str:
    """Minion ids are plain names: no glob or regex characters, so an exact match is exact."""
    if not MINION_ID_RE.fullmatch(minion_id):
        raise ValueError(f"minion id {minion_id!r} invalid: use lowercase letters, digits, '.', '-'")
    return minion_id


def key_state_in(keys: dict[str, list[str]], minion_id: str) -> str | None:
    """A minion's key state in a `key.list_all` answer: 'accepted', 'pending', 'rejected',
    'denied' or None."""
    for state, bucket in (("accepted", "minions"), ("pending", "minions_pre"),
                          ("rejected", "minions_rejected"), ("denied", "minions_denied")):
        if minion_id in keys.get(bucket, []):
            return state
    return None


def keys_of(keys: dict[str, list[str]], minion_ids: list[str]) -> dict[str, list[str]]:
    """The buckets of a `key.list_all` answer that hold keys of these ids, with those ids only:
    what `key.delete_dict` takes to delete exactly them, in every state."""
    found = {bucket: [m for m in minion_ids if m in keys.get(bucket, [])] for bucket in
             ("minions", "minions_pre", "minions_rejected", "minions_denied")}
    return {bucket: ids for bucket, ids in found.items() if ids}


def failed_states(ret: Any) -> list[dict[str, str]]:
    """States with result False in a state return: [{id, sls, comment}], in run order."""
    if not isinstance(ret, dict):
        return []
    failed = [v for v in ret.values() if isinstance(v, dict) and v.get("result") is False]
    failed.sort(key=lambda v: v.get("__run_num__", 0))
    return [{"id": str(v.get("__id__", "?")), "sls": str(v.get("__sls__", "?")),
             "comment": str(v.get("comment", ""))[:500]} for v in failed]


def summarize_failure(ret: Any) -> str:
    states = failed_states(ret)
    if states:
        return "; ".join(f"{s['id']} ({s['sls']}): {s['comment']}" for s in states)
    if isinstance(ret, list):
        return "; ".join(str(x) for x in ret)[:1000]
    text = str(ret).strip()
    if "Traceback (most recent call last)" in text:  # a minion exception: its last line says why
        text = text.splitlines()[-1]
    return text[:1000]
