#!/usr/bin/python3
"""fence_lab: a fence agent that turns Cobbler power calls into HTTP POSTs for the lab.

cobbler_service.prepare_state installs this file as /usr/sbin/fence_lab inside cobblerd's mount
namespace; Cobbler derives power types from /usr/sbin/fence_* names, so power_type "lab" is valid
only there.  Cobbler 3.3.10 (power_manager.PowerManager._power) runs the agent with NO arguments
and writes FenceAgentAPI "key=value" lines to stdin:

    action=on|off|status   (reboot is done by Cobbler itself as off, 5 s sleep, on)
    ip=<power_address>     username=<power_user>  plug=<power_id>  password=<power_pass>
    identity-file=<power_identity_file>           <power_options, verbatim, one per line>

The agent POSTs {"action", "plug", "address"} as JSON to the power_address if that is an http(s)
URL, else to the URL in /etc/cobbler/fence_lab.json, logging in with username/password as HTTP
Basic auth (the simulated BMC refuses a wrong login with 401, as a real BMC would).  Exit codes
follow FenceAgentAPI: 0 success (status: power on), 1 failure, 2 status "off".  Command-line
options (-o/--action, -n/--plug, -a/--ip) are accepted too, so the agent can be driven by hand
like any fence_* agent.
Stdlib only: it runs with whatever python3 the namespace has, outside any venv.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request

CONFIG = "/etc/cobbler/fence_lab.json"
EXIT_OK, EXIT_FAIL, EXIT_OFF = 0, 1, 2

# FenceAgentAPI spells several options in more than one way; map them to one name.
ALIASES = {
    "option": "action",
    "o": "action",
    "port": "plug",
    "n": "plug",
    "ipaddr": "ip",
    "a": "ip",
    "login": "username",
    "l": "username",
    "passwd": "password",
    "p": "password",
}


def parse_stdin(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip()
        options[ALIASES.get(key, key)] = value.strip()
    return options


def parse_argv(argv: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i].lstrip("-")
        if "=" in arg:
            key, value = arg.split("=", 1)
        elif i + 1 < len(argv):
            key, value = arg, argv[i + 1]
            i += 1
        else:
            break
        options[ALIASES.get(key, key)] = value
        i += 1
    return options


def target_url(address: str) -> str:
    if address.startswith(("http://", "https://")):
        return address
    with open(CONFIG, encoding="utf-8") as fh:
        return str(json.load(fh)["power_url"])


def main() -> int:
    # Cobbler only uses stdin; reading it when stdin is a terminal would block a manual run.
    options = {} if sys.stdin is None or sys.stdin.isatty() else parse_stdin(sys.stdin.read())
    options.update(parse_argv(sys.argv[1:]))
    action = options.get("action", "reboot")
    if action == "monitor":
        return EXIT_OK
    if action not in ("on", "off", "reboot", "status"):
        print(f"fence_lab: unsupported action {action!r}", file=sys.stderr)
        return EXIT_FAIL
    address = options.get("ip", "")
    body = json.dumps({"action": action, "plug": options.get("plug", ""), "address": address})
    login = f"{options.get('username', '')}:{options.get('password', '')}".encode()
    try:
        request = urllib.request.Request(
            target_url(address),
            data=body.encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Basic " + base64.b64encode(login).decode()},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        reason = "BMC login refused" if exc.code == 401 else f"HTTP {exc.code}"
        print(f"fence_lab: {action} failed: {reason}", file=sys.stderr)
        return EXIT_FAIL
    except (OSError, ValueError, KeyError) as exc:
        print(f"fence_lab: {action} failed: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if action != "status":
        print("Success: Rebooted" if action == "reboot" else f"Success: Powered {action.upper()}")
        return EXIT_OK
    # The receiver may answer {"status": "on"|"off"} (or "power"); silence means "on".
    try:
        reply = json.loads(raw or b"{}")
    except ValueError:
        reply = {}
    state = "on"
    if isinstance(reply, dict):
        state = str(reply.get("status") or reply.get("power") or "on").lower()
    # Cobbler matches r"^(Status:|.+power\s=)\s(on|off)$" on stdout, and the exit code.
    if state == "off":
        print("Status: OFF")
        return EXIT_OFF
    print("Status: ON")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
