"""Provisioning helpers for the store rollout: the reboot that firstboot asks for, and the
minion restart a changed minion.d file needs (the hypervisor formula's events concern).

On a real machine `provisioning.reboot` calls `system.reboot`. Under the store-rollout lab
(minion config `store_rollout_lab`) it asks the lab's hardware simulator to restart this minion
process instead. A minion with a private `root_dir` is never the host's own minion, so it
refuses to reboot at all: the lab cannot reboot the host.
"""

import json
import os
import urllib.request

from salt.exceptions import CommandExecutionError

__virtualname__ = "provisioning"

BOOTSTRAP_FILES = ("90-bootstrap.conf", "15-identity.conf")


def __virtual__():
    return __virtualname__


def _config_dir():
    return os.path.dirname(__opts__["conf_file"])


def _lab_restart(reason):
    """Under the lab, ask its hardware simulator to restart this minion (a reboot there);
    None on a real machine."""
    lab = __opts__.get("store_rollout_lab")
    if not lab:
        return None
    url = "{}/minions/{}/reboot".format(lab["simulator_url"].rstrip("/"), __opts__["id"])
    req = urllib.request.Request(url, data=json.dumps({"reason": reason}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {"requested": True, "lab": True, "reason": reason,
                "simulator": json.loads(resp.read())}


def _refuse_unless_own_machine(what):
    if os.path.realpath(__opts__.get("root_dir", "/")) != "/" or os.environ.get("STORE_ROLLOUT_LAB"):
        raise CommandExecutionError(
            "refusing to {}: this minion is not the machine's own (private root_dir or "
            "lab)".format(what))


def reboot(reason="firstboot", delay_minutes=1):
    """Reboot this machine (lab: restart this minion). Returns what was requested.

    CLI Example: salt 'store-0001-vm' provisioning.reboot reason=firstboot
    """
    lab = _lab_restart(reason)
    if lab:
        return lab
    _refuse_unless_own_machine("reboot")
    __salt__["system.reboot"](at_time=delay_minutes)
    return {"requested": True, "lab": False, "reason": reason, "in_minutes": delay_minutes}


def restart_minion(reason="configuration changed", delay_seconds=20):
    """Restart this machine's salt-minion once the state run that asked has returned, so new
    minion.d settings (an engine) take effect (lab: the simulator restarts the minion).

    CLI Example: salt 'store-0001-hv' provisioning.restart_minion
    """
    lab = _lab_restart(reason)
    if lab:
        return lab
    _refuse_unless_own_machine("restart salt-minion")
    # a transient timer unit: systemd restarts the minion after this job returned its result
    __salt__["cmd.run_all"](["systemd-run", "--on-active={}".format(int(delay_seconds)),
                             "systemctl", "restart", "salt-minion"],
                            python_shell=False, raise_err=True)
    return {"requested": True, "lab": False, "reason": reason, "in_seconds": delay_seconds}


def bootstrap_files():
    """Absolute paths of the one-shot bootstrap config files firstboot removes at the end."""
    return [os.path.join(_config_dir(), "minion.d", name) for name in BOOTSTRAP_FILES]


def root_path(*parts):
    """A path under this minion's root (/ on a real machine, a private dir in the lab)."""
    return os.path.join(__opts__.get("root_dir", "/"), *parts)
