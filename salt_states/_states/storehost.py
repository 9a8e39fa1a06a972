"""States: boot the Xen entry by default (GRUB's saved entry, by its exact title); the host's
readiness checks, which read only and so run under test=True too."""

__virtualname__ = "storehost"


def __virtual__():
    return __virtualname__


def _saved_entry():
    out = __salt__["cmd.run"]("grub2-editenv list", python_shell=False, ignore_retcode=True)
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key == "saved_entry":
            return value
    return ""


def xen_default_boot(name):
    """`name`: the grub.cfg to read the Xen entry's title from."""
    ret = {"name": name, "changes": {}, "result": True, "comment": ""}
    try:
        title = __salt__["storehost.xen_boot_entry"](name)
    except Exception as exc:  # CommandExecutionError: the message says what to fix
        ret.update(result=False, comment=str(exc))
        return ret
    current = _saved_entry()
    if current == title:
        ret["comment"] = f"{title!r} is the default boot entry"
        return ret
    ret["changes"] = {"saved_entry": {"old": current, "new": title}}
    if __opts__["test"]:
        ret.update(result=None, comment=f"{title!r} would become the default boot entry")
        return ret
    res = __salt__["cmd.run_all"](["grub2-set-default", title], python_shell=False)
    if res["retcode"] != 0:
        ret.update(result=False, changes={},
                   comment=f"grub2-set-default failed: {res['stderr'] or res['stdout']}")
        return ret
    ret["comment"] = f"{title!r} is now the default boot entry"
    return ret


def checked(name, driver="Xen", require_dom0=True, tools=(), bridge=None, devices=()):
    """The hypervisor's readiness checks (storehost.check) as a state that changes nothing:
    True or False with what is missing, the same with test=True (a plan's dry run would
    otherwise list a module.run of a check as a pending change)."""
    ret = {"name": name, "changes": {}, "result": True, "comment": ""}
    try:
        found = __salt__["storehost.check"](driver=driver, require_dom0=require_dom0,
                                            tools=tools, bridge=bridge, devices=devices)
    except Exception as exc:  # CommandExecutionError: names everything that is missing
        ret.update(result=False, comment=str(exc))
        return ret
    ret["comment"] = "hypervisor ready: libvirt driver {}{}{}".format(
        found["driver"], ", Xen dom0" if found["dom0"] else "",
        "".join(", " + path for path in found.get("devices", ())))
    return ret
