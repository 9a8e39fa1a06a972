"""Runs under a store host's interpreter (Python 3.6, Salt 3006.0): loads the project's
salt_states/_modules and _states with Salt's own loader and calls them as a minion would.

stdin: {"opts": {...minion config overrides...},
        "calls": [{"fun": "storevirt.create_overlay", "args": [...], "kwargs": {...}}, ...],
        "define": [<domain XML>, ...],   (defined first, on the minion's libvirt URI)
        "start": [<domain name>, ...],   (then started)
        "stop_during_listing": [<domain name>, ...]}
   (each listing of the host's running domains by id stops the next of these right after it
   answers: another domain stopping while a call looks up domains, as a power cut or a reset
   on the same host does)
stdout: one JSON list, an entry per call: {"ok": true, "ret": ...} or {"ok": false,
        "error": "<exception type>: <message>"}.

Every call is made, whatever the ones before returned, so one run reports every function
that the store host's Python or Salt refuses. This file itself must stay 3.6 syntax
(`make lint` runs vermin on it).
"""

import json
import os
import sys

import salt.config
import salt.loader
import salt.version


def _loaders(overrides):
    opts = salt.config.minion_config(None)
    opts.update(overrides)
    opts["file_client"] = "local"
    utils = salt.loader.utils(opts)
    functions = salt.loader.minion_mods(opts, utils=utils)
    serializers = salt.loader.serializers(opts)
    states = salt.loader.states(opts, functions, utils, serializers)
    return functions, states


def _define(uri, domains, started):
    """Define the domains and start some; the connection is kept open for the run, because
    libvirt's test driver forgets its domains when its last connection closes."""
    import libvirt

    conn = libvirt.open(uri)
    for xml in domains:
        conn.defineXML(xml)
    for name in started:
        conn.lookupByName(name).create()
    return conn


def _stop_during_listing(uri, names):
    import libvirt

    pending = list(names)
    list_ids = libvirt.virConnect.listDomainsID

    def listing_then_a_stop(conn):
        ids = list_ids(conn)
        if pending:
            other = libvirt.open(uri)
            other.lookupByName(pending.pop(0)).destroy()
            other.close()
        return ids

    libvirt.virConnect.listDomainsID = listing_then_a_stop


def _call(table, call):
    try:
        ret = table[call["fun"]](*call.get("args", []), **call.get("kwargs", {}))
    except Exception as exc:  # each failure is reported, with its type, for the test to judge
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "ret": ret}


def main():
    spec = json.load(sys.stdin)
    functions, states = _loaders(spec["opts"])
    uri = spec["opts"].get("virt", {}).get("connection", {}).get("uri")
    held = _define(uri, spec["define"], spec.get("start", [])) if spec.get("define") else None
    _stop_during_listing(uri, spec.get("stop_during_listing", []))
    results = []
    for call in spec["calls"]:
        table = states if call.get("state") else functions
        results.append(_call(table, call))
    if held is not None:
        held.close()
    json.dump({"python": list(sys.version_info[:3]), "salt": salt.version.__version__,
               "pid": os.getpid(), "results": results}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
