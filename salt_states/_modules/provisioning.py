"""Provisioning helpers for the store rollout: the reboot that firstboot asks for, and the
minion restart a changed minion.d file needs (the hypervisor formula's events concern).

`provisioning.reboot` calls `system.reboot`. A minion with a private `root_dir` is never the
machine's own minion, so it refuses to reboot or restart at all: it cannot reboot the host it
runs on. (A minion config may name another provider of these two functions, Salt's
`providers` option.)
"""

import os

from salt.exceptions import CommandExecutionError

__virtualname__ = "provisioning"

BOOTSTRAP_FILES = ("90-bootstrap.conf", "15-identity.conf")


def __virtual__():
    return __virtualname__


def _config_dir():
    return os.path.dirname(__opts__["conf_file"])


def _refuse_unless_own_machine(what):
    if os.path.realpath(__opts__.get("root_dir", "/")) != "/":
        raise CommandExecutionError(
            "refusing to {}: this minion is not the machine's own (private root_dir)".format(what))


def reboot(reason="firstboot", delay_minutes=1):
    """Reboot this machine. Returns what was requested.

    CLI Example: salt 'store-0001-vm' provisioning.reboot reason=firstboot
    """
    _refuse_unless_own_machine("reboot")
    __salt__["system.reboot"](at_time=delay_minutes)
    return {"requested": True, "reason": reason, "in_minutes": delay_minutes}


def restart_minion(reason="configuration changed", delay_seconds=20, unit="salt-minion"):
    """Restart this machine's minion (its systemd `unit`: salt-minion, or the Salt Bundle's
    venv-salt-minion) once the state run that asked has returned, so new minion.d settings (an
    engine) take effect.

    CLI Example: salt 'store-0001-hv' provisioning.restart_minion
    """
    _refuse_unless_own_machine("restart " + unit)
    # a transient timer unit: systemd restarts the minion after this job returned its result
    __salt__["cmd.run_all"](["systemd-run", "--on-active={}".format(int(delay_seconds)),
                             "systemctl", "restart", unit],
                            python_shell=False, raise_err=True)
    return {"requested": True, "reason": reason, "in_seconds": delay_seconds, "unit": unit}


def bootstrap_files():
    """Absolute paths of the one-shot bootstrap config files firstboot removes at the end."""
    return [os.path.join(_config_dir(), "minion.d", name) for name in BOOTSTRAP_FILES]


def root_path(*parts):
    """A path under this minion's root (/ on a real machine, else its private root_dir)."""
    return os.path.join(__opts__.get("root_dir", "/"), *parts)
