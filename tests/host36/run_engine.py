"""Runs under a store host's interpreter (Python 3.6, Salt 3006.0): loads the hypervisor's
store_libvirt_events engine with Salt's own engine loader, starts it as the minion's Engine
process would (its start(), in a thread here) on libvirt's in-process test driver, and plays
one connection loss on it:

1. the engine connects; the runner fires the engine's close callback from libvirt's event loop
   (reason EOF), as libvirt does when the daemon goes away (the test driver has no daemon);
2. the engine sends `connection/lost`, reconnects, sends `connection/restored`;
3. the runner destroys the test driver's domain: its `domain/lifecycle` event comes through
   Salt 3006.0's own libvirt_events callbacks on the new connection.

stdin: {"opts": {...minion config overrides...}, "engines_dir": "...", "timeout": seconds}
stdout: {"python": [...], "salt": "...", "loaded": bool, "events": [[tag, data], ...],
         "error": "..." or null}

This file must stay 3.6 syntax (`make lint` runs vermin on tests/host36).
"""

import json
import os
import sys
import threading
import time

import libvirt
import salt.config
import salt.loader
import salt.version

URI = "test:///default"
ENGINE = "store_libvirt_events"


def main():
    spec = json.load(sys.stdin)
    opts = salt.config.minion_config(None)
    opts.update(spec["opts"])
    opts["engines_dirs"] = [spec["engines_dir"]]
    events = []
    closers = []

    # the close callbacks the engine registers, so the runner can fire one as libvirt would
    register = libvirt.virConnect.registerCloseCallback

    def recording_register(conn, cb, opaque):
        closers.append((conn, cb, opaque))
        return register(conn, cb, opaque)

    libvirt.virConnect.registerCloseCallback = recording_register
    utils = salt.loader.utils(opts)
    # what the engine's events reach: the minion's event.send (here: recorded)
    functions = {"event.send": lambda tag, data: events.append([tag, data]) or True}
    engines = salt.loader.engines(opts, functions, [], utils)
    out = {"python": list(sys.version_info[:3]), "salt": salt.version.__version__,
           "loaded": ENGINE + ".start" in engines, "events": events, "error": None}
    if not out["loaded"]:
        out["error"] = "not loaded: " + str(engines.missing_fun_string(ENGINE + ".start"))
        finish(out)
    # the test driver keeps its domains while one connection of this process is open
    held = libvirt.open(URI)
    failure = []

    def engine():
        try:
            engines[ENGINE + ".start"](uri=URI, tag_prefix="store/libvirt",
                                       filters=["domain/lifecycle"])
        except Exception as exc:  # reported: the test judges
            failure.append(f"{type(exc).__name__}: {exc}")

    threading.Thread(target=engine, daemon=True).start()
    deadline = time.time() + float(spec.get("timeout", 30))

    def wait(what, test):
        while not test():
            if failure or time.time() > deadline:
                out["error"] = failure[0] if failure else "timed out waiting for " + what
                finish(out)
            time.sleep(0.05)

    wait("the engine's first connection", lambda: len(closers) == 1)
    conn, cb, opaque = closers[0]

    def close_from_the_loop(timer, _opaque):
        libvirt.virEventRemoveTimeout(timer)
        cb(conn, libvirt.VIR_CONNECT_CLOSE_REASON_EOF, opaque)

    libvirt.virEventAddTimeout(0, close_from_the_loop, None)
    wait("connection/restored", lambda: any(t.endswith("/connection/restored") for t, _ in events))
    held.lookupByName("test").destroy()
    wait("the domain's lifecycle event",
         lambda: any(t.endswith("/domain/lifecycle") for t, _ in events))
    held.close()
    finish(out)


def finish(out):
    json.dump(out, sys.stdout, default=str)
    sys.stdout.flush()
    os._exit(0)  # the engine's thread runs libvirt's event loop forever


if __name__ == "__main__":
    main()
