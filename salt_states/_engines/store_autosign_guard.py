"""Salt master engine: a one-time autosign token signs in the minion id it was issued for,
once.

Salt's `autosign_grains_dir` accepts any minion id whose grain value is listed, and the token
travels in the AutoYaST profile Cobbler serves without authentication: whoever reads it during
the install could present it with any id. With `auth_events_autosign_grains: [accept]` the
master's `salt/auth` accept event carries the grains a minion signed in with, so this engine
sees which token signed which id, at the moment the key is accepted:
- the token's own id: the token is revoked at once (it has done its one job);
- any other id: that key is deleted again and `store/autosign/refused` is fired with the id,
  the id the token was issued for and the key's fingerprint (the token stays for its owner,
  whose install is still under way; step 3 names the attempt in that store's rollout).
A second key claiming the token's own id is the master's business: it denies the later key,
and step 3 fails on the two keys.

The event is only a hint: any accepted minion can fire a `salt/auth` of its own making (a batch
event, which Salt's minion event blacklist lets through) naming another store's id and an
outstanding token. So the guard acts, revoking or deleting, only when the master's own key files
back the event: `<pki_dir>/minions/<id>` exists, holds the event's public key, and was written
within KEY_FRESH_SECONDS (a real accept fires `salt/auth` at once; a key accepted before that is
never the guard's to delete). Anything else is logged as a forged `salt/auth`, ignored, and
fired as `store/autosign/forged` (tests/unit/salt_states/test_autosign_guard.py).

Master config:
    engines_dirs: [<file_roots>/_engines]
    engines: [store_autosign_guard]
    auth_events_autosign_grains: [accept]
"""

import contextlib
import fcntl
import json
import logging
import os
import time

import salt.crypt
import salt.key
import salt.utils.crypt
import salt.utils.event
import salt.utils.verify

log = logging.getLogger(__name__)
# store_rollout.contracts: AUTOSIGN_GRAIN, TOKEN_MAP_FILE, AUTOSIGN_REFUSED_TAG,
# AUTOSIGN_FORGED_TAG (checked)
AUTOSIGN_GRAIN = "store_rollout_token"
TOKEN_MAP_FILE = "store_rollout_tokens.json"
AUTOSIGN_REFUSED_TAG = "store/autosign/refused"
AUTOSIGN_FORGED_TAG = "store/autosign/forged"
# how old an accepted key file may be for its salt/auth to be acted on: the master writes the file
# and fires the event in the same request, the guard reads it within milliseconds; the margin is
# for a busy master, and a key older than this was accepted before any event the guard sees
KEY_FRESH_SECONDS = 120


def _paths(opts):
    grains_dir = opts["autosign_grains_dir"]
    autosign = os.path.join(grains_dir, AUTOSIGN_GRAIN)
    return autosign, os.path.join(os.path.dirname(grains_dir), TOKEN_MAP_FILE)


@contextlib.contextmanager
def _tokens_locked(opts):
    """The pipeline's token files, under the lock it takes for them (tasks/salt/tokens.py)."""
    autosign, token_map = _paths(opts)
    lock_path = os.path.splitext(autosign)[0] + ".lock"
    with os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600), "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(token_map) as fh:
                mapping = json.load(fh)
        except (OSError, ValueError):
            mapping = {}
        yield autosign, token_map, mapping


def _rewrite(path, text):
    tmp = os.path.splitext(path)[0] + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    # 0600 from its creation (a chmod after the write leaves the tokens readable meanwhile)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def owner_of(opts, token):
    """The minion id an outstanding one-time token was issued for, or None."""
    with _tokens_locked(opts) as (_autosign, _token_map, mapping):
        return next((mid for mid, tok in mapping.items() if tok == token), None)


def _same_key(one, other):
    return bool(one) and salt.crypt.clean_key(one) == salt.crypt.clean_key(other)


def unbacked(opts, minion_id, pub, now=None):
    """Why the master's key files do not back an accept of `minion_id` with `pub`, or None when
    they do: its accepted key file exists, holds `pub` and was written just now."""
    if not isinstance(minion_id, str) or not salt.utils.verify.valid_id(opts, minion_id):
        return "not a valid minion id"
    pki = opts["cluster_pki_dir"] if opts.get("cluster_id") else opts["pki_dir"]
    path = os.path.join(pki, "minions", minion_id)
    try:
        written = os.stat(path).st_mtime
        with open(path) as fh:
            on_file = fh.read()
    except OSError:
        return "no accepted key"
    if not _same_key(str(pub or ""), on_file):
        return "its public key is not the accepted key"
    age = (time.time() if now is None else now) - written
    if not -5 <= age <= KEY_FRESH_SECONDS:
        return "its key was accepted {:.0f} s ago, not by this sign-in".format(age)
    return None


def judge(opts, minion_id, token):
    """What an accepted sign-in with `token` means: ("revoked"|"foreign"|None, owner id)."""
    with _tokens_locked(opts) as (autosign, token_map, mapping):
        owner = next((mid for mid, tok in mapping.items() if tok == token), None)
        if owner is None:
            return None, None  # not an outstanding token: the key was accepted another way
        if owner != minion_id:
            return "foreign", owner
        del mapping[owner]
        _rewrite(token_map, json.dumps(mapping, sort_keys=True))
        try:
            with open(autosign) as fh:
                tokens = [line.strip() for line in fh if line.strip()]
        except OSError:
            tokens = []
        if token in tokens:
            _rewrite(autosign, "".join("{}\n".format(t) for t in tokens if t != token))
        return "revoked", owner


def _refuse(opts, bus, minion_id, owner, pub):
    with salt.key.get_key(opts) as keys:
        keys.delete_key(match_dict={"minions": [minion_id]})
    finger = salt.utils.crypt.pem_finger(key=pub.encode(), sum_type=opts.get("hash_type", "sha256"))
    log.warning("autosign guard: minion %r signed in with the one-time token of %r; its key "
                "(%s) was removed", minion_id, owner, finger)
    bus.fire_event({"id": minion_id, "token_of": owner, "fingerprint": finger},
                   AUTOSIGN_REFUSED_TAG)


def _forged(bus, minion_id, owner, why):
    log.warning("autosign guard: forged salt/auth for minion %r (token of %r) ignored: %s",
                minion_id, owner, why)
    bus.fire_event({"id": minion_id, "token_of": owner, "reason": why}, AUTOSIGN_FORGED_TAG)


def handle(opts, bus, data, now=None):
    """One `salt/auth` event's data: "revoked", "foreign" (key deleted), "forged" (ignored) or
    None (not an accept with an outstanding token: nothing to do)."""
    if not isinstance(data, dict):
        return None
    grains = data.get("autosign_grains")
    token = grains.get(AUTOSIGN_GRAIN) if isinstance(grains, dict) else None
    if data.get("act") != "accept" or data.get("result") is not True or not token:
        return None
    token, minion_id = str(token), data.get("id")
    owner = owner_of(opts, token)
    if owner is None:
        return None  # not an outstanding token: a re-auth, or a key accepted another way
    why = unbacked(opts, minion_id, data.get("pub"), now)
    if why is not None:
        _forged(bus, minion_id, owner, why)
        return "forged"
    verdict, owner = judge(opts, minion_id, token)
    if verdict == "revoked":
        log.info("autosign guard: %s signed in; its one-time token is revoked", minion_id)
    elif verdict == "foreign":
        _refuse(opts, bus, minion_id, owner, str(data["pub"]))
    return verdict


def start():
    opts = __opts__  # noqa: F821 (the loader's)
    with salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True) as bus:
        while True:
            event = bus.get_event(full=True, wait=5)
            if not event or event.get("tag") != "salt/auth":
                continue
            data = event.get("data") or {}
            try:
                handle(opts, bus, data)
            except Exception:  # pylint: disable=broad-except
                # one bad event must not end the guard for every later one
                log.exception("autosign guard: sign-in of %r not judged",
                              data.get("id") if isinstance(data, dict) else data)
