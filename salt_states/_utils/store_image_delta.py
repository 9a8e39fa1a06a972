"""A base image rebuilt from a delta (storevirt.ensure_base_image with `delta`), a Salt utils
module shared with the image server's side (store_rollout/image_delta.py builds the delta).

A delta is a qcow2 overlay whose backing is the previous version's image and which holds only
the clusters that differ. The host rebuilds the full image from its cached, verified old image
(the delta is pointed at it, then flattened) and checks the result against the digest the
server recorded at build time: the sha256 of the guest-visible content (raw bytes, the image's
virtual size), which does not depend on the qcow2 file's layout. Only then may it get its
final name; the caller falls back to the full download on any refusal.

Python 3.6 and Salt 3006.0 as well as Salt 3008.
"""

import hashlib
import os
import subprocess
import tempfile

CHUNK = 1024 * 1024


def _run(argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    if proc.returncode:
        raise ValueError("{} failed: {}".format(" ".join(argv[:2]), proc.stderr.strip()))
    return proc.stdout


def content_sha256(image):
    """sha256 of the guest-visible bytes of qcow2 `image` (its raw content, backing included)."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(image))) as tmp:
        raw = os.path.join(tmp, "content.raw")
        _run(["qemu-img", "convert", "-q", "-f", "qcow2", "-O", "raw", image, raw])
        digest = hashlib.sha256()
        with open(raw, "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                digest.update(block)
        return digest.hexdigest()


def rebuild(old_image, delta, out, expected_content_sha256):
    """Write `out` (a standalone qcow2) = `old_image` + `delta`, verified end to end against
    `expected_content_sha256`. Raises ValueError naming the mismatch; `out` then does not
    exist. `delta` is consumed (re-pointed at `old_image`)."""
    part = out + ".rebuild"
    try:
        # the delta names the server's path of its backing: point it at the host's copy
        _run(["qemu-img", "rebase", "-u", "-f", "qcow2", "-b", os.path.abspath(old_image),
              "-F", "qcow2", delta])
        _run(["qemu-img", "convert", "-q", "-f", "qcow2", "-O", "qcow2", delta, part])
        actual = content_sha256(part)
        if actual != expected_content_sha256:
            raise ValueError("rebuilt image's content sha256 is {}, the server recorded {}".format(
                actual, expected_content_sha256))
        os.replace(part, out)
    finally:
        if os.path.exists(part):
            os.remove(part)
