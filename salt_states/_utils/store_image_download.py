"""The hypervisor's download of a base image (storevirt.ensure_base_image), a Salt utils module:
the minion's loader offers it to execution modules as __utils__["store_image_download.*"], and
a highstate's or saltutil.sync_utils' sync brings it from salt://_utils. It is given everything
it needs (no __salt__ here: the utils loader packs none).

- verified: the sha256 must match before the image gets its final name; a mismatch removes
  the download and fails naming the image, both digests and the URL;
- resumable: a cut download stays as image.qcow2.part and the next call asks for the rest
  (HTTP Range) instead of starting again;
- atomic: the final name only ever holds a verified image; one download per image and host;
- TLS verified against the system trust store or a given CA (PEM text), never skipped;
- paced to a rate limit in bytes/s when given, so a wave does not fill the store links.

Python 3.6 and Salt 3006.0 (a Leap 15.6 store host) as well as Salt 3008.
"""

import fcntl
import hashlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request

from salt.exceptions import CommandExecutionError

DOWNLOAD_CHUNK = 256 * 1024
DOWNLOAD_CUT = "download cut"  # the orchestrator retries (resumes) on this


def base_image_path(images_dir, key):
    """Where base image `key` lives once verified: <images>/base/<key>/image.qcow2."""
    return os.path.join(images_dir, "base", key, "image.qcow2")


def ensure_base_image(images_dir, source, key, sha256, meta=None, ca_pem=None, rate_limit=None,
                      timeout=60, delta=None, rebuild=None):
    """Cache base image `key` from `source` (an http(s):// URL) under `images_dir`, with its
    meta.json when `meta` is given. Returns what it did: path, bytes transferred now, the
    offset it resumed from, seconds, whether it was cached already, and how ("mode": full or
    delta, "full_size").

    `delta` ({"source", "sha256", "old_key", "content_sha256"}) offers the image as a delta
    from the verified base image `old_key`: when this host holds it, the delta is downloaded
    (same verified, resumable, paced path) and `rebuild` (store_image_delta.rebuild) makes and
    verifies the full image; any refusal falls back to the full download."""
    dest = base_image_path(images_dir, key)
    result = {"path": dest, "transferred": 0, "resumed_from": 0, "seconds": 0.0,
              "cached": os.path.exists(dest), "mode": "cached"}
    if result["cached"]:
        return result
    if not source.startswith(("http://", "https://")):
        raise CommandExecutionError(
            "image {}: {} is not an http(s) URL; the hypervisor downloads its base image from "
            "the image server (setting image_base_url)".format(key, source))
    base_dir = os.path.dirname(dest)
    os.makedirs(base_dir, exist_ok=True)
    # one download per base image on this host: a concurrent call (another VM of the
    # same image, a rerun) waits here, then finds the verified image
    with open(os.path.join(base_dir, ".download.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(dest):
            result["cached"] = True
            return result
        if delta and rebuild and os.path.exists(base_image_path(images_dir, delta["old_key"])):
            try:
                return _via_delta(images_dir, key, delta, rebuild, meta, ca_pem, rate_limit,
                                  timeout, dest, dict(result))
            except CommandExecutionError as exc:
                if DOWNLOAD_CUT in str(exc):
                    raise  # resumed by the next attempt, like a full download
                result["delta_refused"] = str(exc)
        result["mode"] = "full"
        return _download(source, key, sha256, meta, ca_pem, rate_limit, timeout, dest,
                         result)


def _via_delta(images_dir, key, delta, rebuild, meta, ca_pem, rate_limit, timeout, dest,
               result):
    """The delta's download and the rebuild; raises CommandExecutionError on any refusal."""
    part = os.path.join(os.path.dirname(dest), "delta-from-{}.qcow2".format(delta["old_key"]))
    result = _download(delta["source"], key, delta["sha256"], None, ca_pem, rate_limit,
                       timeout, part, result)
    try:
        os.chmod(part, 0o644)  # the rebuild re-points its backing at this host's old image
        rebuild(base_image_path(images_dir, delta["old_key"]), part, dest,
                delta["content_sha256"])
    except (ValueError, OSError) as exc:
        raise CommandExecutionError("image {}: delta from {} refused: {}".format(
            key, delta["old_key"], exc)) from None
    finally:
        os.remove(part)
    if meta is not None:
        with open(os.path.join(os.path.dirname(dest), "meta.json"), "w") as fh:
            json.dump(meta, fh, indent=2)
    os.chmod(dest, 0o444)
    result.update(mode="delta", full_size=os.path.getsize(dest))
    return result


def _sha256_of(path, digest):
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(DOWNLOAD_CHUNK), b""):
            digest.update(block)
    return digest


def _open_url(url, offset, ca_pem, timeout):
    headers = {"Range": "bytes={}-".format(offset)} if offset else {}
    request = urllib.request.Request(url, headers=headers)
    context = None
    if url.startswith("https://"):
        # TLS is always verified: the system's trust store, or the CA the settings name
        context = ssl.create_default_context(cadata=ca_pem) if ca_pem \
            else ssl.create_default_context()
    return urllib.request.urlopen(request, timeout=timeout, context=context)


def _download(source, key, sha256, meta, ca_pem, rate_limit, timeout, dest, result):
    """ensure_base_image's transfer, under its lock."""
    import http.client

    base_dir = os.path.dirname(dest)
    part = dest + ".part"
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    digest = _sha256_of(part, hashlib.sha256()) if offset else hashlib.sha256()
    started = time.monotonic()
    try:
        response = _open_url(source, offset, ca_pem, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            response = None  # nothing left to fetch: verify what we have
        else:
            raise CommandExecutionError("image {}: GET {} answered HTTP {} {}".format(
                key, source, exc.code, exc.reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandExecutionError("image {}: cannot fetch {}: {}".format(
            key, source, reason)) from None
    if response is not None:
        with response:
            if offset and response.status != 206:  # the server ignored the range
                offset, digest = 0, hashlib.sha256()
            result["resumed_from"] = offset
            chunk_size = min(DOWNLOAD_CHUNK, int(rate_limit)) if rate_limit else DOWNLOAD_CHUNK
            with open(part, "ab" if offset else "wb") as out:
                try:
                    for block in iter(lambda: response.read(chunk_size), b""):
                        out.write(block)
                        digest.update(block)
                        result["transferred"] += len(block)
                        if rate_limit:
                            ahead = result["transferred"] / float(rate_limit) - (
                                time.monotonic() - started)
                            if ahead > 0:
                                time.sleep(ahead)
                except (http.client.IncompleteRead, OSError) as exc:
                    cut = str(exc)
                else:
                    # a closed connection ends the body early without an error: count it
                    expected = int(response.headers.get("Content-Length") or -1)
                    cut = "{} of {} bytes".format(result["transferred"], expected) \
                        if 0 <= expected != result["transferred"] else None
            if cut:
                raise CommandExecutionError(
                    "image {}: {} from {} at {} bytes ({}); the next attempt resumes "
                    "there".format(key, DOWNLOAD_CUT, source, offset + result["transferred"],
                                   cut))
    actual = digest.hexdigest()
    if actual != sha256:
        os.remove(part)
        raise CommandExecutionError(
            "image {}: sha256 mismatch for {}: expected {}, got {}; the download was "
            "removed".format(key, source, sha256, actual))
    if meta is not None:
        with open(os.path.join(base_dir, "meta.json"), "w") as fh:
            json.dump(meta, fh, indent=2)
    os.chmod(part, 0o444)  # the base is never written: overlays only
    os.replace(part, dest)
    result["seconds"] = round(time.monotonic() - started, 3)
    result["full_size"] = os.path.getsize(dest)
    return result
