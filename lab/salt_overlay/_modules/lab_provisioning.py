"""The lab's `provisioning.reboot` and `provisioning.restart_minion`.

Every simulated machine's minion config (lab/simulator/minions.py) names this module the
provider of `provisioning` (`providers: {provisioning: lab_provisioning}`): Salt's loader takes
these two functions from here and the rest from salt_states/_modules/provisioning.py. A reboot
asks the lab's hardware simulator (minion config `store_rollout_lab`) to restart this minion
process, never the host. Runs under the store hosts' Python 3.6 too (vermin).
"""

import json
import urllib.request


def _simulator_restart(reason):
    url = "{}/minions/{}/reboot".format(
        __opts__["store_rollout_lab"]["simulator_url"].rstrip("/"), __opts__["id"])
    req = urllib.request.Request(url, data=json.dumps({"reason": reason}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {"requested": True, "lab": True, "reason": reason,
                "simulator": json.loads(resp.read())}


def reboot(reason="firstboot", delay_minutes=1):
    """The simulator restarts this minion after a second, as `shutdown -r` returns first;
    delay_minutes is the real machine's."""
    return _simulator_restart(reason)


def restart_minion(reason="configuration changed", delay_seconds=20, unit="salt-minion"):
    """The simulator restarts this minion after a second (the state run returns first);
    `unit` is the real machine's (salt-minion, or the Bundle's venv-salt-minion)."""
    return _simulator_restart(reason)
