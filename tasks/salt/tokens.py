"""One-time autosign tokens: the master's autosign file and the pipeline's token map.

Both files sit on the master host, beside its config; the master's autosign guard engine
(salt_states/_engines/store_autosign_guard.py) takes the same lock and edits them too.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from store_rollout.contracts import AUTOSIGN_GRAIN, TOKEN_MAP_FILE
from store_rollout.private_files import open_private, write_private
from tasks.salt.errors import SaltError
from tasks.salt.minions import check_minion_id


def new_autosign_token() -> str:
    """192 random bits as hex: a value the seed disk and the guest's store-identity accept
    as is (a urlsafe token may begin with '-' or '_', which they refuse)."""
    return secrets.token_hex(24)


class AutosignTokens:
    """The tokens in `autosign_grains_dir/<AUTOSIGN_GRAIN>` (what the master accepts) and
    their owners in the token map beside it (which minion id each token is for)."""

    def __init__(self, autosign_grains_dir: str | Path, master_user: str,
                 master_config: str) -> None:
        self.grains_dir = Path(autosign_grains_dir)
        self.master_user = master_user
        self.master_config = master_config

    @property
    def autosign_file(self) -> Path:
        return self.grains_dir / AUTOSIGN_GRAIN

    @contextmanager
    def _locked(self) -> Iterator[list[str]]:
        path = self.autosign_file
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_suffix(".lock")
        with os.fdopen(open_private(lock_path), "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # the master's autosign guard takes this lock and edits these files too
            self._give_to_master(lock_path)
            lines = path.read_text().splitlines() if path.exists() else []
            tokens = [t for t in (line.strip() for line in lines) if t]
            before = list(tokens)
            yield tokens
            if tokens != before:  # the master re-reads the file on each auth
                write_private(path, "".join(f"{t}\n" for t in tokens), self._give_to_master)

    def _give_to_master(self, path: Path) -> None:
        """The master reads the autosign file as its own user (`user:` in its config; Leap's
        salt-master runs as `salt`): a worker running as root hands the file over; a worker
        running as another user cannot, and says so."""
        import pwd

        try:
            owner = pwd.getpwnam(self.master_user)
        except KeyError:
            raise SaltError(f"the Salt master's user {self.master_user!r} (`user:` in "
                            f"{self.master_config}) does not exist on this host",
                            operation="autosign", master_config=self.master_config) from None
        if os.geteuid() == owner.pw_uid:
            return
        if os.geteuid() != 0:
            raise SaltError(
                f"the Salt master runs as {self.master_user!r} but this worker as uid "
                f"{os.geteuid()}: the master could not read {path.with_suffix('')} (mode 600); "
                f"run the worker as {self.master_user!r} or root",
                operation="autosign", master_config=self.master_config)
        os.chown(path, owner.pw_uid, owner.pw_gid)

    @property
    def _map_file(self) -> Path:
        return self.grains_dir.parent / TOKEN_MAP_FILE

    def _map(self) -> dict[str, str]:
        path = self._map_file
        return json.loads(path.read_text()) if path.exists() else {}

    def _write_map(self, mapping: dict[str, str]) -> None:
        # the master's autosign guard reads it
        write_private(self._map_file, json.dumps(mapping, sort_keys=True), self._give_to_master)

    def issue(self, minion_id: str) -> str:
        """A one-time autosign token for exactly one minion id (reused until revoked)."""
        check_minion_id(minion_id)
        with self._locked() as tokens:
            mapping = self._map()
            token = mapping.get(minion_id) or new_autosign_token()
            mapping[minion_id] = token
            self._write_map(mapping)
            if token not in tokens:
                tokens.append(token)
        return token

    def token_for(self, minion_id: str) -> str | None:
        with self._locked():
            return self._map().get(minion_id)

    def revoke(self, minion_id: str) -> bool:
        """Remove the minion's token: once its key is accepted it must not sign anything else."""
        with self._locked() as tokens:
            mapping = self._map()
            token = mapping.pop(minion_id, None)
            self._write_map(mapping)
            if token and token in tokens:
                tokens.remove(token)
                return True
        return False

    def all(self) -> list[str]:
        with self._locked() as tokens:
            return list(tokens)
