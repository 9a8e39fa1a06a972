"""The lab's `service` module for simulated store VMs: their systemd units without systemd.

A simulated VM is a salt-minion process, not a machine with an init: its minion config
(lab/simulator/minions.py) names this module the provider of `service`, so the store_vm
formula's `service.running` and the go-live gate's `service.status` act on the units the
formula wrote under the minion's root_dir, never on the lab host's systemd. A unit is started
as systemd would: its ExecStart in its WorkingDirectory (under the root), on the machine's own
network (the minion's namespace), in the machine's process group (a reboot or power cut, which
stops the group, stops it). Enabled units start at boot: lab/host_namespace.py `--boot-root`
calls `boot` before it execs the minion. Runs under the store hosts' Python 3.6 too.
"""

import os
import shlex
import signal
import subprocess
import time

__func_alias__ = {"reload_": "reload"}

UNIT_DIR = "etc/systemd/system"
WANTS_DIR = "etc/systemd/system/multi-user.target.wants"
RUN_DIR = "run/lab-units"
LOG_DIR = "var/log/lab-units"
# in RUN_DIR (emptied at each boot): this boot's units fail to start, at boot and at every
# later start until the next boot (the lab's `service_start` fault lasts the whole boot)
UNITS_FAIL_FILE = "units-fail"


def _unit(name):
    return name if name.endswith(".service") else name + ".service"


def _under(root, path):
    return os.path.join(root, path.lstrip("/"))


def _unit_file(root, name):
    return _under(root, os.path.join(UNIT_DIR, _unit(name)))


def _read_unit(root, name):
    """The [Service] ExecStart and WorkingDirectory of a unit file (the keys the formula
    writes); {} when there is no such unit."""
    try:
        with open(_unit_file(root, name)) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    service, section = {}, ""
    for line in lines:
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            service[key.strip()] = value.strip()
    return service


def _pid_of(root, name):
    """The unit's main process if it runs (a zombie does not), else None."""
    try:
        with open(_under(root, os.path.join(RUN_DIR, _unit(name) + ".pid"))) as handle:
            pid = int(handle.read().strip())
        with open("/proc/{}/stat".format(pid)) as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else pid


def _start_unit(root, name):
    """Start the unit unless it runs; True when it runs afterwards. False without trying in a
    boot with the `service_start` fault."""
    if os.path.exists(_under(root, os.path.join(RUN_DIR, UNITS_FAIL_FILE))):
        return False
    if _pid_of(root, name):
        return True
    service = _read_unit(root, name)
    if not service.get("ExecStart"):
        return False
    for directory in (RUN_DIR, LOG_DIR):
        os.makedirs(_under(root, directory), exist_ok=True)
    log = _under(root, os.path.join(LOG_DIR, _unit(name) + ".log"))
    argv = " ".join(shlex.quote(arg) for arg in shlex.split(service["ExecStart"]))
    # sh backgrounds it and leaves: the unit keeps the machine's process group and session
    # (stopped with the machine), and an init reaps it, not the minion
    script = "{} >>{} 2>&1 </dev/null & echo $!".format(argv, shlex.quote(log))
    pid = int(subprocess.run(["/bin/sh", "-c", script], stdout=subprocess.PIPE, check=True,
                             cwd=_under(root, service.get("WorkingDirectory", "/")),
                             universal_newlines=True).stdout.strip())
    with open(_under(root, os.path.join(RUN_DIR, _unit(name) + ".pid")), "w") as handle:
        handle.write(str(pid))
    time.sleep(0.3)  # a command that fails at once is seen failing, as systemd would
    return _pid_of(root, name) is not None


def _stop_unit(root, name):
    pid = _pid_of(root, name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _pid_of(root, name) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_of(root, name):
            os.kill(pid, signal.SIGKILL)
    return _pid_of(root, name) is None


def _enabled_units(root):
    try:
        return sorted(os.listdir(_under(root, WANTS_DIR)))
    except OSError:
        return []


def _boot(root, start_units=True, whole_boot=False):
    """A boot: /run starts empty, then (as systemd does for multi-user.target) every enabled
    unit starts; `start_units` False: they all fail to start (the lab's `service_start` fault),
    and with `whole_boot` so does every start in this boot (a machine's own knob: a new version
    whose services cannot run; the step's knob leaves a technician's later start working).
    Returns {unit: runs}."""
    run_dir = _under(root, RUN_DIR)
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        os.remove(os.path.join(run_dir, name))
    if not start_units and not whole_boot:
        return {name: False for name in _enabled_units(root)}
    if not start_units:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, UNITS_FAIL_FILE), "w") as handle:
            handle.write("the service_start fault of this boot\n")
    return {name: start_units and _start_unit(root, name) for name in _enabled_units(root)}


# -- Salt's `service` functions (what states.service and the go-live gate call) ---------------
# Salt's loader adds the functions of its own `service` module (systemd_service) that this one
# lacks, so every one of them is here too: none may reach the lab host's systemd.
def _root():
    return __opts__.get("root_dir", "/")


def available(name):
    return os.path.exists(_unit_file(_root(), name))


def missing(name):
    return not available(name)


def get_all():
    try:
        return sorted(n[:-len(".service")] for n in os.listdir(_under(_root(), UNIT_DIR))
                      if n.endswith(".service"))
    except OSError:
        return []


def status(name, sig=None):
    return _pid_of(_root(), name) is not None


def start(name, **kwargs):
    return _start_unit(_root(), name)


def stop(name, **kwargs):
    return _stop_unit(_root(), name)


def restart(name, **kwargs):
    _stop_unit(_root(), name)
    return _start_unit(_root(), name)


def enabled(name, **kwargs):
    return _unit(name) in _enabled_units(_root())


def disabled(name):
    return not enabled(name)


def enable(name, **kwargs):
    wants = _under(_root(), WANTS_DIR)
    os.makedirs(wants, exist_ok=True)
    link = os.path.join(wants, _unit(name))
    if not os.path.lexists(link):
        os.symlink(os.path.join("..", _unit(name)), link)
    return True


def disable(name, **kwargs):
    link = os.path.join(_under(_root(), WANTS_DIR), _unit(name))
    if os.path.lexists(link):
        os.remove(link)
    return True


def get_enabled():
    return [name[:-len(".service")] for name in _enabled_units(_root())]


def get_disabled():
    return sorted(set(get_all()) - set(get_enabled()))


def get_running():
    return [name for name in get_all() if status(name)]


def get_static():
    return []


def offline():
    """Not a chroot without systemd (Salt's offline mode would then change nothing): this
    module's units are the machine's."""
    return False


def masked(name, runtime=False):
    return False


def reload_(name, **kwargs):
    return restart(name)


def force_reload(name, **kwargs):
    return restart(name)


def systemctl_reload():
    return True  # unit files are read at each start


def _no_systemd(function):
    def refuse(*args, **kwargs):
        from salt.exceptions import CommandExecutionError

        raise CommandExecutionError(
            "service.{}: a simulated machine of the lab has no systemd".format(function))
    return refuse


mask = _no_systemd("mask")
unmask = _no_systemd("unmask")
show = _no_systemd("show")
execs = _no_systemd("execs")
firstboot = _no_systemd("firstboot")
