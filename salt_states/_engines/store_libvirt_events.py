"""Salt minion engine: a store host's libvirt events on Salt's event bus, on a libvirt connection
that outlives a restart of its daemon.

Salt's own libvirt_events engine (Salt 3006, salt/engines/libvirt_events.py) opens one read-only
connection, registers its callbacks and runs libvirt's event loop forever, with no close callback
and no keepalive: once the daemon restarts (virtxend on a Leap 15.6 Xen host: a package update,
a crash) that connection is dead and the events stop, with nothing said. This engine sends the
same events (that engine's own callbacks, tags and data) but keeps the connection:

- a close callback, and a keepalive, so a daemon that stops answering without closing its socket
  is given up after keepalive_interval * (keepalive_count + 1) seconds (20 s by default);
- a lost connection fires `<tag_prefix>/<uri>/connection/lost` (why: eof, keepalive, error), then
  reconnects after 1, 2, 4 ... seconds (at most retry_max); connected again, it fires
  `<tag_prefix>/<uri>/connection/restored` with how long it was away and the state of every
  domain, since the events of that window are lost for good;
- a loss not yet restored is kept in the minion's cachedir, so `restored` still follows when the
  minion restarted meanwhile (a host rebooted while virtxend was failing);
- a saltutil sync that replaces this file (every highstate syncs `_engines`) makes it return;
  the minion's process manager starts the engine again from the new file within about 10 s.

Every event is signed with this minion's own key (Signer): the master's event bus cannot tell a
host's events from another minion's that claim its id (a minion's batch event carries whatever id
its sender wrote), so the master's store_prefect_events believes one only when the accepted
public key of the id it claims verifies its signature.

Before the reboot into Xen the host has no virtxend socket: the engine retries quietly (one
warning in the minion log) and fires nothing, since it never had a connection to lose.

Minion config (minion.d/60-libvirt-events.conf: the AutoYaST profile writes it, the hypervisor
formula's events concern manages the same text):

    engines:
      - store_libvirt_events:
          uri: xen:///system
          tag_prefix: store/libvirt
          filters: ["domain/lifecycle"]

Runs on the store host's Salt 3006 and Python 3.6 (vermin in `make lint`, a call under 3.6 in
tests/unit/salt_states/test_host_python36.py). The AutoYaST profile also writes this very file, as
the Cobbler snippet store_libvirt_events.py, into the minion's extension modules, so the first
minion start has it: Cobbler renders the snippet with Cheetah, so the text must come out unchanged
(no dollar sign, no hash sign followed by anything but a space;
tests/unit/salt_states/test_libvirt_events_engine.py).
"""

import base64
import hashlib
import json
import logging
import os
import time

import salt.crypt

try:
    import libvirt
except ImportError:  # the master and the store VMs sync this file too; only hosts run it
    libvirt = None

try:
    # the built-in engine, whose callbacks, tags and data this one reuses (Salt 3008 moved it
    # out of core; the store hosts run Salt 3006)
    import salt.engines.libvirt_events as builtin
except ImportError:
    builtin = None

log = logging.getLogger(__name__)

# this engine's own events, after `<tag_prefix>/<uri>/` as the built-in engine's tags
# (store_rollout.contracts.LIBVIRT_CONNECTION_LOST / LIBVIRT_CONNECTION_RESTORED)
CONNECTION_LOST = "connection/lost"
CONNECTION_RESTORED = "connection/restored"
# virConnectCloseReason, as the lost event names it
CLOSE_REASONS = {0: "error", 1: "eof", 2: "keepalive", 3: "client"}
# virDomainState, as the restored event names each domain's
DOMAIN_STATES = {0: "nostate", 1: "running", 2: "blocked", 3: "paused", 4: "shutdown",
                 5: "shutoff", 6: "crashed", 7: "pmsuspended"}
# the loss that no restored event has answered yet, kept across restarts of this process
STATE_FILE = "store_libvirt_events.json"
# where each event body carries its signature, {"time": epoch seconds, "value": base64}
# (store_rollout.contracts.STORE_EVENT_SIGNATURE; the master's store_prefect_events reads it)
SIGNATURE_FIELD = "signature"
# libvirt's event loop wakes at least this often (seconds), whatever the connection does: a
# sync that replaced this file is seen, and the minion's SIGTERM handled, without waiting for it
WAKE_SECONDS = 5


def __virtual__():
    if builtin is None:
        return False, "store_libvirt_events needs Salt 3006's built-in libvirt_events engine"
    return builtin.__virtual__()


def canonical(tag, minion_id, body, signed_at):
    """The text a store event's signature covers: its tag, the minion id it claims, its body
    (without the signature and Salt's own __ keys) and when it was signed, as sorted compact
    JSON. The master's store_prefect_events builds the same text to verify it."""
    body = dict((key, value) for key, value in body.items()
                if key != SIGNATURE_FIELD and not str(key).startswith("__"))
    return json.dumps({"tag": tag, "id": minion_id, "body": body, "time": signed_at},
                      sort_keys=True, separators=(",", ":"), default=str)


class Signer(object):
    """The minion's functions as the built-in engine's event helper reaches them
    (__salt__["event.send"]), with each event body signed by this minion's own key, the one the
    master accepted (salt.crypt.sign_message: the same PKCS1v15 signature in Salt 3006.0 and
    3008). Without a readable key the event goes out unsigned, and the master believes none."""

    def __init__(self, functions, minion_id, key_path, clock=time.time):
        self.functions = functions
        self.minion_id = minion_id
        self.key_path = key_path
        self.clock = clock
        self.warned = False

    def __getitem__(self, name):
        return self.send if name == "event.send" else self.functions[name]

    def __contains__(self, name):
        return name in self.functions

    def send(self, tag, data=None, **kwargs):
        body = dict(data or {})
        signed_at = int(self.clock())
        try:
            signature = salt.crypt.sign_message(
                self.key_path, canonical(tag, self.minion_id, body, signed_at))
        except Exception as exc:  # pylint: disable=broad-except
            if not self.warned:
                log.warning("store_libvirt_events: cannot sign with %s (%s): the master ignores "
                            "this host's events", self.key_path, exc)
                self.warned = True
        else:
            body[SIGNATURE_FIELD] = {"time": signed_at,
                                     "value": base64.b64encode(signature).decode("ascii")}
        return self.functions["event.send"](tag, body, **kwargs)


class _Uri(object):
    """Stands in for a connection where the built-in engine's event helper only asks its URI
    (the tag names it): a lost connection cannot be asked anything any more."""

    def __init__(self, uri):
        self.uri = uri

    def getURI(self):
        return self.uri


class Source(object):
    """This module's file as it was loaded; changed() once a sync replaced it (a deleted file
    counts as unchanged: the engine keeps running rather than fail to load again)."""

    def __init__(self, path, every=WAKE_SECONDS, clock=time.monotonic):
        self.path = path
        self.every = every
        self.clock = clock
        self.checked = clock()
        self.stat = self._stat()
        self.digest = self._digest()

    def _stat(self):
        try:
            st = os.stat(self.path)
        except (OSError, TypeError):
            return None
        return (st.st_mtime, st.st_size)

    def _digest(self):
        try:
            with open(self.path, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        except (OSError, TypeError):
            return None

    def changed(self):
        if self.path is None or self.clock() - self.checked < self.every:
            return False
        self.checked = self.clock()
        stat = self._stat()
        if stat is None or stat == self.stat:
            return False
        digest = self._digest()
        if digest is None or digest == self.digest:
            self.stat = stat  # touched, not changed
            return False
        return True


class Watcher(object):
    """One libvirt connection at a time, kept up: see the module's docstring.

    lib: the libvirt module; events: Salt 3006's salt.engines.libvirt_events (its callbacks
    send through its module's __opts__ and __salt__, which start() sets)."""

    def __init__(self, lib, events, uri, tag_prefix, filters, keepalive_interval=5,
                 keepalive_count=3, retry_max=30.0, state_path=None, source=None,
                 clock=time.time, sleep=time.sleep):
        self.lib = lib
        self.events = events
        self.uri = uri
        self.tag_prefix = tag_prefix
        self.filters = list(filters or ["all"])
        self.keepalive = (int(keepalive_interval), int(keepalive_count))
        self.retry_max = float(retry_max)
        self.state_path = state_path
        self.source = source
        self.clock = clock
        self.sleep = sleep
        self.conn = None
        self.callback_ids = {}
        self.closed = []
        self.connected_uri = uri
        self.attempts = 0
        self.lost = self._load_state()

    # -- the loop ------------------------------------------------------------------------------
    def run(self):
        """Watch until this module's file changes (then return); raises if libvirt's event loop
        itself fails, and the minion's process manager starts the engine again."""
        delay = 1.0
        while not self._source_changed():
            if not self.connect():
                self.sleep(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            began = self.clock()
            reason = self.serve()
            self.disconnect()
            if reason is None:
                break
            self.mark_lost(reason)
            if self.clock() - began < self.retry_max:
                # it dropped soon after it was made: wait before the next, longer each time,
                # rather than fire lost and restored in a tight loop
                self.sleep(delay)
                delay = min(delay * 2, self.retry_max)
            else:
                delay = 1.0
        log.info("store_libvirt_events: this engine's file changed; the minion starts it again "
                 "from the new one")

    def _source_changed(self):
        return self.source is not None and self.source.changed()

    def connect(self):
        """Open, watch and register; fires `restored` when a loss is pending. False when the
        daemon does not answer (yet)."""
        try:
            conn = self.lib.openReadOnly(self.uri)
        except self.lib.libvirtError as exc:
            self.attempts += 1
            (log.warning if self.attempts == 1 else log.debug)(
                "store_libvirt_events: cannot connect to %s (attempt %s, retrying): %s",
                self.uri or "libvirt's default URI", self.attempts, exc)
            return False
        self.conn, self.closed, self.callback_ids = conn, [], {}
        try:
            conn.registerCloseCallback(self._on_close, self.closed)
        except self.lib.libvirtError as exc:  # serve() still polls isAlive()
            log.warning("store_libvirt_events: no close callback on %s: %s", self.uri, exc)
        try:
            conn.setKeepAlive(*self.keepalive)
        except self.lib.libvirtError as exc:
            # a driver inside this process (test:///) has none; virtxend's socket has
            log.debug("store_libvirt_events: no keepalive on %s: %s", self.uri, exc)
        try:
            self.connected_uri = conn.getURI()
            self.callback_ids = self.register(conn)
            if self.lost is not None:
                self.fire_restored(conn)
        except self.lib.libvirtError as exc:  # gone again at once: the loss stays pending
            self.attempts += 1
            log.warning("store_libvirt_events: %s failed right after connecting: %s",
                        self.connected_uri, exc)
            self.disconnect()
            return False
        log.info("store_libvirt_events: watching %s (%s)", self.connected_uri,
                 ", ".join(self.filters))
        self.attempts = 0
        return True

    def register(self, conn):
        """The built-in engine's callbacks for the configured filters, as its start() picks
        them; {object: [callback id]}."""
        ids = {}
        everything = "all" in self.filters
        for obj, event_defs in self.events.CALLBACK_DEFS.items():
            for event, real_id in event_defs:
                if "/".join((obj, event)) in self.filters or obj in self.filters or everything:
                    callback_id = self.events._register_callback(conn, self.tag_prefix, obj,
                                                                  event, real_id)
                    # the first callback's id can be 0, which the built-in engine's
                    # `if registered_id:` drops (and never deregisters)
                    if callback_id is not None:
                        self.events._append_callback_id(ids, obj, callback_id)
        return ids

    def serve(self):
        """Run libvirt's event loop (the callbacks send the events) until the connection closes
        (its reason) or this file changed (None)."""
        while not self.closed:
            if self.lib.virEventRunDefaultImpl() < 0:
                raise RuntimeError("libvirt's event loop failed")
            if not self.closed and not self._alive():
                self.closed.append("error")
            if not self.closed and self._source_changed():
                return None
        return self.closed[0]

    def _alive(self):
        try:
            return self.conn.isAlive() == 1
        except self.lib.libvirtError:
            return False

    def _on_close(self, conn, reason, closed):
        closed.append(CLOSE_REASONS.get(reason, "unknown"))

    def disconnect(self):
        """Let the connection go; each callback on its own, since on a dead connection every
        deregistration reports an error after freeing its side."""
        conn, self.conn = self.conn, None
        for obj, ids in self.callback_ids.items():
            for callback_id in ids:
                try:
                    self.events._callbacks_cleanup(conn, {obj: [callback_id]})
                except self.lib.libvirtError:
                    pass
        self.callback_ids = {}
        for release in (conn.unregisterCloseCallback, conn.close):
            try:
                release()
            except self.lib.libvirtError:
                pass

    # -- the connection events -------------------------------------------------------------------
    def mark_lost(self, reason):
        self.lost = {"since": self.clock(), "reason": reason, "uri": self.connected_uri}
        self._save_state()
        log.warning("store_libvirt_events: lost the connection to %s (%s); reconnecting",
                    self.connected_uri, reason)
        self.fire(CONNECTION_LOST, {"reason": reason})

    def fire_restored(self, conn):
        down = max(0.0, self.clock() - float(self.lost.get("since") or 0))
        self.fire(CONNECTION_RESTORED, {
            "reason": self.lost.get("reason"), "down_seconds": round(down, 1),
            "attempts": self.attempts, "domains": self.domain_states(conn)})
        log.warning("store_libvirt_events: connection to %s restored after %.1f s",
                    self.connected_uri, down)
        self.lost = None
        self._save_state()

    def domain_states(self, conn):
        states = {}
        for dom in conn.listAllDomains(0):
            try:
                states[dom.name()] = DOMAIN_STATES.get(dom.state()[0], "unknown")
            except self.lib.libvirtError:
                continue  # gone meanwhile
        return states

    def fire(self, suffix, data):
        obj, event = suffix.split("/")
        self.events._salt_send_event({"prefix": self.tag_prefix, "object": obj, "event": event},
                                     _Uri(self.connected_uri or ""), data)

    # -- the pending loss, on disk -------------------------------------------------------------
    def _load_state(self):
        if not self.state_path or not os.path.exists(self.state_path):
            return None
        try:
            with open(self.state_path) as handle:
                state = json.load(handle)
        except (OSError, ValueError) as exc:
            log.warning("store_libvirt_events: ignoring %s: %s", self.state_path, exc)
            return None
        if not isinstance(state, dict):
            return None
        self.connected_uri = state.get("uri") or self.uri
        return state

    def _save_state(self):
        if not self.state_path:
            return
        try:
            if self.lost is None:
                if os.path.exists(self.state_path):
                    os.remove(self.state_path)
                return
            tmp = self.state_path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(self.lost, handle)
            os.rename(tmp, self.state_path)
        except OSError as exc:  # the events still go out; only a restart would forget the loss
            log.warning("store_libvirt_events: cannot keep %s: %s", self.state_path, exc)


def _wake(_timer, _opaque):
    """A timer that only makes libvirt's event loop return (see WAKE_SECONDS)."""


def _libvirt_error(_ctx, error):
    # libvirt prints every error to stderr by default: each failed reconnect would reach the
    # journal; the engine logs what matters itself
    log.debug("store_libvirt_events: libvirt: %s", error)


def start(uri=None, tag_prefix="salt/engines/libvirt_events", filters=None,
          keepalive_interval=5, keepalive_count=3, retry_max=30):
    """Engine entry point: runs in its own process, started (and restarted when it returns or
    fails) by the minion's process manager."""
    # the built-in engine's callbacks send through its own module's dunders, which only a
    # module the loader loaded has: give it this process's, its events signed
    builtin.__opts__ = __opts__
    builtin.__salt__ = Signer(__salt__, __opts__["id"],
                              os.path.join(__opts__["pki_dir"], "minion.pem"))
    libvirt.virEventRegisterDefaultImpl()
    libvirt.registerErrorHandler(_libvirt_error, None)
    libvirt.virEventAddTimeout(WAKE_SECONDS * 1000, _wake, None)
    watcher = Watcher(libvirt, builtin, uri, tag_prefix, filters,
                      keepalive_interval=keepalive_interval, keepalive_count=keepalive_count,
                      retry_max=retry_max,
                      state_path=os.path.join(__opts__["cachedir"], STATE_FILE),
                      source=Source(__file__))
    watcher.run()
