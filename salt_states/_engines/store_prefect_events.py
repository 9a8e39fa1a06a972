"""Salt engine: forward the rollout's Salt events to Prefect's events API.

Master config:
    engines_dirs: [<file_roots>/_engines]
    engines:
      - store_prefect_events:
          api_url: https://prefect.example:4200/api
          auth_string_file: /etc/salt/prefect-api-auth   # user:password, mode 0600
          ca_file: /etc/salt/prefect-api-ca.pem           # the CA the API's certificate is from
          prefixes: [store/, salt/key, salt/minion/store-]

`auth_string_file` holds the Prefect server's PREFECT_SERVER_API_AUTH_STRING (the master's user
only may read it: a file others can read is refused, nothing is forwarded); the engine sends it
as HTTP basic auth. `ca_file` verifies the API's TLS (unset: the system's trust store); TLS is
never skipped, and a credential is never sent over plain http except to loopback.

Each matching event becomes a Prefect event named after its tag (`store/vm/firstboot/done` ->
`salt.store.vm.firstboot.done`, `salt/key` -> `salt.key`) on the resource
`salt.minion.<id>`, with `store.id` and the related resources `store.<id>` and the run tag
`store-<id>` when the minion id is `store-<id>-hv|vm`, so the Prefect UI's event feed shows the
rollout's Salt side next to its flow runs.

A hypervisor's libvirt_events engine (tags under LIBVIRT_EVENT_PREFIX) reports its domains'
lifecycle: a store VM's becomes `salt.store.libvirt.domain.<event>` (started, stopped,
crashed...) on the resource `libvirt.domain.<name>`, related to its store. Only the store's own
hypervisor is believed (several hypervisors' minions may watch one shared libvirtd), and only
on its key's word: the event's `id` is what the sending minion wrote (a batch event), so each
event must carry a signature of its tag, claimed id, body and time made with the claimed
minion's own key (the hypervisor's store_libvirt_events engine signs them), verified here with
that id's accepted public key and at most SIGNED_EVENT_MAX_AGE seconds old (SignedEvents); what
does not verify is dropped with a warning naming the id it claimed.
"""

import base64
import datetime
import json
import logging
import os
import re
import ssl
import stat
import time
import urllib.parse
import urllib.request
import uuid

import salt.crypt
import salt.utils.event
import salt.utils.verify

log = logging.getLogger(__name__)
# a refreshed box's hypervisor is store-<id>-hv-<6 hex digits of its MAC> (issue 48)
STORE_MINION = re.compile(r"^store-(?P<store>[a-z0-9-]+?)-(?:hv|vm|hv-[0-9a-f]{6})$")
STORE_HYPERVISOR = r"store-%s-hv(?:-[0-9a-f]{6})?"
STORE_DOMAIN = re.compile(r"^store-(?P<store>[a-z0-9-]+)-vm$")
# the hypervisors' libvirt_events tag_prefix (store_rollout.contracts.LIBVIRT_EVENT_TAG_PREFIX)
LIBVIRT_EVENT_PREFIX = "store/libvirt"
# the hypervisor engine's own events, `<prefix>/<uri>/<suffix>`: its libvirt connection lost and
# restored (store_rollout.contracts.LIBVIRT_CONNECTION_LOST / _RESTORED); each becomes
# `salt.store.libvirt.connection.lost|restored` on the hypervisor, related to its store, so a
# gap in the domain events is seen next to the store's runs
LIBVIRT_CONNECTION_EVENTS = ("connection/lost", "connection/restored")
# where the hypervisor engine puts each event's signature (store_rollout.contracts.
# STORE_EVENT_SIGNATURE), and how long after signing an event is believed: the hosts' and the
# master's clocks agree to seconds (NTP), a replay inside the window is dropped by its signature
SIGNATURE_FIELD = "signature"
SIGNED_EVENT_MAX_AGE = 300


def _canonical(tag, minion_id, body, signed_at):
    """What the signature covers: as store_libvirt_events.canonical builds it on the host."""
    body = {key: value for key, value in body.items()
            if key != SIGNATURE_FIELD and not str(key).startswith("__")}
    return json.dumps({"tag": tag, "id": minion_id, "body": body, "time": signed_at},
                      sort_keys=True, separators=(",", ":"), default=str)


class SignedEvents:
    """Store events believed on their claimed minion's key, not on their word."""

    def __init__(self, opts, max_age=SIGNED_EVENT_MAX_AGE, clock=time.time):
        self.opts, self.max_age, self.clock = opts, max_age, clock
        self.seen = {}  # signature -> when it was signed: each is believed once

    def _problem(self, tag, data):
        if not isinstance(data, dict):
            return "not an event body"
        claimed, body = data.get("id"), data.get("data")
        signature = body.get(SIGNATURE_FIELD) if isinstance(body, dict) else None
        if not isinstance(signature, dict):
            return "not signed"
        if not isinstance(claimed, str) or not salt.utils.verify.valid_id(self.opts, claimed):
            return "no valid minion id"
        pub = os.path.join(self.opts["pki_dir"], "minions", claimed)
        if not os.path.isfile(pub):
            return "no accepted key for that id"
        signed_at, value = signature.get("time"), signature.get("value")
        if not isinstance(signed_at, int) or abs(self.clock() - signed_at) > self.max_age:
            return f"signed at {signed_at!r}, not within {self.max_age} s"
        try:
            raw = base64.b64decode(str(value), validate=True)
            valid = salt.crypt.verify_signature(pub, _canonical(tag, claimed, body, signed_at), raw)
        except Exception as exc:  # pylint: disable=broad-except
            # a malformed event (or key file) is dropped; it must not end the forwarder
            return f"signature unreadable ({type(exc).__name__}: {exc})"
        if not valid:
            return "its signature is not that minion's"
        if value in self.seen:
            return "a replay of an event already forwarded"
        now = self.clock()
        self.seen = {v: at for v, at in self.seen.items() if now - at <= self.max_age}
        self.seen[value] = signed_at
        return None

    def verified(self, tag, data):
        """True when the minion `data` claims signed this event just now; else a warning."""
        problem = self._problem(tag, data)
        if problem is not None:
            log.warning("store_prefect_events: dropped %s claiming minion %r: %s", tag,
                        data.get("id") if isinstance(data, dict) else None, problem)
        return problem is None


def _store_related(store):
    return [{"prefect.resource.id": f"store.{store}", "prefect.resource.role": "store",
             "prefect.resource.name": f"store {store}"},
            {"prefect.resource.id": f"prefect.tag.store-{store}", "prefect.resource.role": "tag"}]


def _domain_event(data):
    """A hypervisor's libvirt lifecycle event of a store VM, or None (another domain, or a
    hypervisor that is not the store's)."""
    hypervisor = data.get("id") or ""
    body = data.get("data") if isinstance(data.get("data"), dict) else {}
    domain = body.get("domain") or {}
    match = STORE_DOMAIN.match(str(domain.get("name") or ""))
    if not match or not re.fullmatch(STORE_HYPERVISOR % re.escape(match.group("store")),
                                     hypervisor):
        return None
    store = match.group("store")
    event = str(body.get("event") or "unknown").lower()
    return {
        "id": str(uuid.uuid4()),
        "occurred": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "event": f"salt.store.libvirt.domain.{event}",
        "resource": {"prefect.resource.id": f"libvirt.domain.{domain['name']}",
                     "prefect.resource.name": domain["name"], "store.id": store},
        "related": [*_store_related(store),
                    {"prefect.resource.id": f"salt.minion.{hypervisor}",
                     "prefect.resource.role": "hypervisor"}],
        "payload": {"domain": domain["name"], "uuid": domain.get("uuid"), "event": event,
                    "detail": body.get("detail"), "hypervisor": hypervisor,
                    "uri": body.get("uri")},
    }


def _connection_event(tag, data):
    """A hypervisor's libvirt connection lost or restored, or None (another tag). Of the domain
    states a restored event lists, only the store's own VM is kept (several hypervisors' minions
    may watch one shared libvirtd)."""
    suffix = next((s for s in LIBVIRT_CONNECTION_EVENTS if tag.endswith("/" + s)), None)
    if suffix is None:
        return None
    hypervisor = data.get("id") or ""
    body = data.get("data") if isinstance(data.get("data"), dict) else {}
    match = STORE_MINION.match(hypervisor)
    store = match.group("store") if match else None
    payload = {"hypervisor": hypervisor, "uri": body.get("uri"), "reason": body.get("reason")}
    for key in ("down_seconds", "attempts"):
        if key in body:
            payload[key] = body[key]
    if "domains" in body:
        payload["domains"] = {name: state for name, state in (body.get("domains") or {}).items()
                              if store and name == f"store-{store}-vm"}
    resource = {"prefect.resource.id": f"salt.minion.{hypervisor or 'unknown'}"}
    if store:
        resource["store.id"] = store
    return {
        "id": str(uuid.uuid4()),
        "occurred": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "event": "salt.store.libvirt." + suffix.replace("/", "."),
        "resource": resource,
        "related": _store_related(store) if store else [],
        "payload": json.loads(json.dumps(payload, default=str)),
    }


def _libvirt_event(signed, tag, data):
    """A hypervisor's libvirt event as a Prefect event, or None (not signed by the hypervisor it
    claims, not the store's own domain, or not one to forward)."""
    if not signed.verified(tag, data):
        return None
    return _connection_event(tag, data) or _domain_event(data)


def _prefect_event(tag, data):
    # a master-side re-announcement (reactor runner.event.send) names its minion in the data
    minion = data.get("id") or data.get("minion") or (data.get("data") or {}).get("minion") or ""
    match = STORE_MINION.match(minion) or STORE_MINION.match(tag.split("/")[2] if tag.count("/") > 2 else "")
    resource = {"prefect.resource.id": f"salt.minion.{minion or 'master'}"}
    related = []
    if match:
        store = match.group("store")
        resource["store.id"] = store
        # the store as a related resource (the event feed's filter) and its rollout's run tag,
        # so one store's Salt events and flow runs are found together
        related = _store_related(store)
    payload = data.get("data") if isinstance(data.get("data"), dict) else {}
    payload = {k: v for k, v in payload.items() if not k.startswith("__") and "token" not in k}
    for key in ("act", "result", "fun", "retcode"):
        if key in data:
            payload[key] = data[key]
    return {
        "id": str(uuid.uuid4()),
        "occurred": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "event": tag.replace("/", ".") if tag.startswith("salt/") else "salt." + tag.replace("/", "."),
        "resource": resource,
        "related": related,
        "payload": json.loads(json.dumps(payload, default=str)),
    }


class ForwarderConfigError(Exception):
    """The engine's configuration cannot be used safely (says which key and the fix)."""


def _auth_header(auth_string_file):
    """`Basic <base64 user:password>` of the credential's file, or None without one."""
    if not auth_string_file:
        return None
    try:
        mode = os.stat(auth_string_file).st_mode
        with open(auth_string_file, encoding="utf-8") as handle:
            auth = handle.read().strip()
    except OSError as exc:
        raise ForwarderConfigError(f"auth_string_file {auth_string_file}: cannot read it "
                                   f"({exc.strerror}); name the file of the API's user:password") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ForwarderConfigError(f"auth_string_file {auth_string_file}: others may read it "
                                   f"(mode {stat.filemode(mode)}); chmod 600 it")
    if ":" not in auth:
        raise ForwarderConfigError(f"auth_string_file {auth_string_file}: not a user:password "
                                   "line; write the server's PREFECT_SERVER_API_AUTH_STRING")
    return "Basic " + base64.b64encode(auth.encode("utf-8")).decode("ascii")


def _connection(api_url, auth_string_file=None, ca_file=None):
    """(headers, TLS context) for posts to `api_url`; refuses a credential in clear."""
    url = urllib.parse.urlsplit(api_url)
    auth = _auth_header(auth_string_file)
    if url.scheme != "https" and auth and url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ForwarderConfigError(f"api_url {api_url}: the credential would cross the network "
                                   "in clear; use the API's https:// URL")
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    context = ssl.create_default_context(cafile=ca_file) if url.scheme == "https" else None
    return headers, context


def _post(api_url, events, headers=None, context=None):
    req = urllib.request.Request(api_url.rstrip("/") + "/events", data=json.dumps(events).encode(),
                                 headers=headers or {"Content-Type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=5, context=context):
        pass


def start(api_url, prefixes=("store/",), auth_string_file=None, ca_file=None):
    """Engine entry point: runs in its own master process for the master's lifetime."""
    try:
        headers, context = _connection(api_url, auth_string_file, ca_file)
    except (ForwarderConfigError, OSError, ssl.SSLError) as exc:
        log.error("store_prefect_events: not forwarding: %s", exc)  # never the credential
        time.sleep(30)  # then the master starts the engine again: a fixed file is read anew
        return
    signed = SignedEvents(__opts__)
    with salt.utils.event.get_master_event(__opts__, __opts__["sock_dir"], listen=True) as bus:
        while True:
            raw = bus.get_event(full=True, wait=1)
            if not raw or not any(raw["tag"].startswith(p) for p in prefixes):
                continue
            data = raw.get("data") or {}
            if not raw["tag"].startswith(LIBVIRT_EVENT_PREFIX + "/"):
                event = _prefect_event(raw["tag"], data)
            else:
                event = _libvirt_event(signed, raw["tag"], data)
            if event is None:
                continue
            try:
                _post(api_url, [event], headers, context)
            except Exception as exc:  # Prefect down: the rollout itself does not depend on this
                log.warning("store_prefect_events: could not forward %s: %s", raw["tag"], exc)
