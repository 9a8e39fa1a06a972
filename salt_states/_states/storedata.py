"""State: the store server's role state directory is the data disk's mount (storedata module).

The image mounts the data disk before salt-minion starts; this state makes sure of it before
anything of the role is written (a role writing to the system disk would lose its state with
the next image update), and mounts it when the image did not. It fails, writing nothing,
when there is no such disk or another one is mounted there."""

__virtualname__ = "storedata"


def __virtual__():
    return __virtualname__


def mounted(name, label, fstype="ext4"):
    """`name`: the mount point as on the store server (/srv/store); `label`: the data disk's
    filesystem label. On a minion with a private root_dir (a simulated machine) the
    directory under that root must be there (the simulator's data disk)."""
    ret = {"name": name, "changes": {}, "result": True, "comment": ""}
    status = __salt__["storedata.mount_status"](name, label)
    if status["ok"]:
        ret["comment"] = "{} is the data disk: {}".format(name, status["observed"])
        return ret
    if status["found"] != "unmounted":
        ret.update(result=False, comment="{} is not the data disk ({}): the store server's "
                   "state would land on its system disk; give the VM its data disk (step 5, "
                   "storevirt.create_data_disk) labelled {}".format(name, status["observed"],
                                                                    label))
        return ret
    ret["changes"] = {"mounted": {"old": None, "new": "LABEL={}".format(label)}}
    if __opts__["test"]:
        ret.update(result=None, comment="LABEL={} would be mounted at {}".format(label, name))
        return ret
    try:
        after = __salt__["storedata.mount"](name, label, fstype=fstype)
    except Exception as exc:  # CommandExecutionError: says what failed
        ret.update(result=False, changes={}, comment=str(exc))
        return ret
    if not after["ok"]:
        ret.update(result=False, changes={}, comment="{} after mounting: {}".format(
            name, after["observed"]))
        return ret
    ret["comment"] = "mounted LABEL={} at {}".format(label, name)
    return ret
