"""The go-live gate's checks of a store server, run by its own minion through the master.

The checks are data: the store server's config file (the store_vm formula writes it from its
map: parameters/defaults.yaml, then pillar `store_vm:lookup`) lists the role's services (a
systemd unit that must run, a port that must answer on the store network, an HTTP answer) and
the machine's own checks (free disk, the data disk mounted where the role keeps its state and
writable, clock). `storegate.run` runs them all and returns one row per check; the
orchestrator (tasks/go_live.py) decides and reports. Runs under the store hosts' Python 3.6
(vermin).
"""

import os
import socket
import tempfile
import time
import urllib.error
import urllib.request

import yaml

__virtualname__ = "storegate"

CONNECT_TIMEOUT = 3.0
HTTP_TIMEOUT = 5.0


def __virtual__():
    return __virtualname__


def _row(check, kind, passed, observed, expected):
    return {"check": check, "kind": kind, "passed": bool(passed), "observed": str(observed),
            "expected": str(expected)}


def _store_address():
    """The address the store's tills reach this server at: its first address that is not
    loopback (grain ipv4), else loopback."""
    addresses = [a for a in __grains__.get("ipv4", []) if not a.startswith("127.")]
    return addresses[0] if addresses else "127.0.0.1"


def _service(name, unit):
    running = bool(__salt__["service.status"](unit))
    enabled = bool(__salt__["service.enabled"](unit))
    observed = "{}, {}".format("running" if running else "not running",
                               "enabled" if enabled else "not enabled")
    return _row("service {} ({}) runs".format(name, unit), "service", running and enabled,
                observed, "running, enabled")


def _port(name, address, port):
    try:
        with socket.create_connection((address, int(port)), timeout=CONNECT_TIMEOUT):
            observed = "answers"
    except OSError as exc:
        observed = "refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
    return _row("{} port {} answers".format(name, port), "port", observed == "answers",
                "{} at {}".format(observed, address), "answers")


def _http(name, address, port, http):
    url = "http://{}:{}{}".format(address, port, http.get("path", "/"))
    expected = int(http.get("status", 200))
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        status = "no answer ({})".format(exc)
    return _row("{} answers HTTP {}".format(name, expected), "http", status == expected,
                "{} from {}".format(status, url), expected)


def _disk(disk):
    path = disk.get("path", "/")
    minimum = int(disk.get("min_free_mb", 0))
    stat = os.statvfs(__salt__["provisioning.root_path"](path.lstrip("/")))
    free_mb = stat.f_bavail * stat.f_frsize // (1024 * 1024)
    return _row("disk {} has {} MB free".format(path, minimum), "disk", free_mb >= minimum,
                "{} MB free".format(free_mb), "at least {} MB free".format(minimum))


def _data_disk(check):
    """The data disk is mounted where the role keeps its state, and takes a write."""
    path, label = check.get("path", "/srv/store"), check.get("label", "STORE_DATA")
    status = __salt__["storedata.mount_status"](path, label)
    observed, passed = status["observed"], status["ok"]
    if passed:
        try:
            with tempfile.NamedTemporaryFile(dir=status["path"], prefix=".go-live-") as probe:
                probe.write(b"go-live")
                probe.flush()
                os.fsync(probe.fileno())
            observed += ", writable"
        except OSError as exc:
            passed, observed = False, "{}, not writable: {}".format(observed, exc.strerror)
    return _row("data disk {} mounted and writable".format(path), "data_disk", passed,
                observed, "the disk labelled {}, writable".format(label))


def _clock(clock, reference_epoch):
    most = float(clock.get("max_skew_seconds", 30))
    skew = abs(time.time() - float(reference_epoch))
    return _row("clock within {:g} s of the master's".format(most), "clock", skew <= most,
                "{:.1f} s off".format(skew), "at most {:g} s off".format(most))


def run(config, reference_epoch=None):
    """Run the store server's go-live checks; one row per check: {check, kind, passed,
    observed, expected}. `config`: the store server's config file, relative to this minion's
    root; `reference_epoch`: the orchestrator's clock when it asked (no clock check without).

    CLI Example: salt 'store-0001-vm' storegate.run etc/store-server/store.yaml 1767225600
    """
    path = __salt__["provisioning.root_path"](config)
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle) or {}
    except OSError as exc:
        return [_row("role config {} readable".format("/" + config), "config", False,
                     exc.strerror, "written by the store_vm highstate")]
    address = _store_address()
    rows = []
    for name, service in sorted((data.get("services") or {}).items()):
        if service.get("unit"):
            rows.append(_service(name, service["unit"]))
        if service.get("port"):
            rows.append(_port(name, address, service["port"]))
            if service.get("http"):
                rows.append(_http(name, address, service["port"], service["http"]))
    checks = data.get("go_live") or {}
    if checks.get("disk"):
        rows.append(_disk(checks["disk"]))
    if checks.get("data_disk"):
        rows.append(_data_disk(checks["data_disk"]))
    if checks.get("clock") and reference_epoch is not None:
        rows.append(_clock(checks["clock"], reference_epoch))
    return rows
