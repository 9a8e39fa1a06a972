"""Start a simulated store host's process in a mount namespace in which the lab's state dir
(the orchestrator's image cache, master config, lab.json, credentials) is not there: a store host
has none of it. Only what the host would have is bound back (its own disk, the libvirt socket,
the VM images dir that libvirtd shares with it).

Run under `unshare --mount --propagation private` (the namespace's mounts never reach the host):
    python host_namespace.py --hide <lab dir> --keep <path>... -- <command>...
Standard library only: it runs with the store host's Python (the Salt 3006 venv).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess

MS_BIND = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hide", required=True, help="directory to replace by an empty tmpfs")
    parser.add_argument("--keep", action="append", default=[], help="path under it to keep")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    # hold the kept directories open: after the tmpfs covers their path, /proc/self/fd/N still
    # reaches them and the kernel binds them back (a path string would name the empty tmpfs)
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in args.keep}
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "store-host-hidden",
                    args.hide], check=True)
    libc = ctypes.CDLL(None, use_errno=True)
    for path, fd in kept.items():
        os.makedirs(path, exist_ok=True)
        if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"bind {path}: {os.strerror(errno)}")
        os.close(fd)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
