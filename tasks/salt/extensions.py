"""The project's custom Salt modules as the master serves them, against what a minion runs.

A rerun's step 4 used to ask the hypervisor to sync its utils and modules every time (two jobs,
0.5 s, issue 28) although they change only with a project update. Now it reads the hypervisor's
hashes in the job that asks for the domain anyway and syncs only when they differ from the
master's.
"""

from __future__ import annotations

import re
from typing import Any

from store_rollout.contracts import HYPERVISOR_EXTENSION_FORMS, SYNCED_EXTENSION_PATTERN

SALTENV = "base"  # top.sls has only base; a named env spares the minion a render of it


def served_extension_hashes(fileserver: Any, hash_type: str,
                            forms: tuple[str, ...] = HYPERVISOR_EXTENSION_FORMS) -> dict[str, str]:
    """{"<form>/<path>": digest} of the files `saltutil.sync_<form>` would copy from the
    master's file server (`salt.fileserver.Fileserver`: roots, gitfs or any other backend, first
    root first as the minion gets them), in the master's `hash_type`; the same keys as
    storevirt.extension_hashes on the minion."""
    found: dict[str, str] = {}
    for form in forms:
        prefix = f"_{form}/"
        for path in fileserver.file_list({"saltenv": SALTENV, "prefix": f"_{form}"}):
            if path.startswith(prefix) and re.search(SYNCED_EXTENSION_PATTERN, path):
                answer = fileserver.file_hash({"path": path, "saltenv": SALTENV})
                found[f"{form}/{path[len(prefix):]}"] = str(answer.get("hsum", ""))
    return found
