"""A base image update as a delta: two image versions that differ by exactly one Debian package,
the delta the image server publishes (store_rollout/image_delta.py) and the host's rebuild and
end-to-end check (salt_states/_utils/store_image_delta.py). Prints one JSON object.

The two versions are NOT KIWI builds (a KIWI build needs root, loop devices and a repository this
bench does not assume): each is an ext4 filesystem made with `mke2fs -d` (no mount) from the
same Debian packages unpacked with `dpkg-deb -x` (from apt's cache, sorted by name), v2 with one
more package, converted to qcow2. Fixed UUID and hash seed, so only the package's files differ.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, emit, machine

from store_rollout.image_delta import make_delta

DEBS = "/var/cache/apt/archives/*.deb"
UUID = "5f1d0c6e-2b8a-4f7e-9c43-0d1e2f3a4b5c"


# when apt's cache holds too few (a machine whose packages came preinstalled, or whose apt
# cleans its cache): these, fetched once with `apt-get download` (Debian 12's; ~35 MiB)
FALLBACK_PACKAGES = ("coreutils", "libicu72", "libperl5.36", "libpython3.11-stdlib",
                     "perl-modules-5.36", "r-cran-mlbench", "vim-runtime", "libxml2", "bash",
                     "python3.11-minimal", "libsqlite3-0", "tzdata")
FALLBACK_DIR = REPO / ".cache" / "bench-debs"


def available_debs(total_mib: int) -> list[str]:
    """apt's cached .deb files if they are enough, else the fallback set (downloaded once)."""
    debs = sorted(glob.glob(DEBS))
    if len(debs) >= 3 and sum(Path(d).stat().st_size for d in debs) > (total_mib + 8) << 20:
        return debs
    FALLBACK_DIR.mkdir(parents=True, exist_ok=True)
    if len(list(FALLBACK_DIR.glob("*.deb"))) < len(FALLBACK_PACKAGES):
        subprocess.run(["apt-get", "download", "-q", *FALLBACK_PACKAGES], cwd=FALLBACK_DIR,
                       check=True, stdout=subprocess.DEVNULL)
    return sorted(str(d) for d in FALLBACK_DIR.glob("*.deb"))


def packages(total_mib: int) -> tuple[list[str], str]:
    """The base set (sorted by name, about `total_mib` MiB) and the one package v2 adds."""
    debs = available_debs(total_mib)
    if len(debs) < 3:
        raise SystemExit(f"bench_delta_image: needs Debian packages in {DEBS}")
    chosen, size = [], 0
    for deb in debs[1:]:
        if size >= total_mib << 20:
            break
        chosen.append(deb)
        size += Path(deb).stat().st_size
    extra = min((d for d in debs if d not in chosen), key=lambda d: abs(
        Path(d).stat().st_size - (1 << 20)))  # a ~1 MiB package, like a typical addition
    return chosen, extra


ENV = {"E2FSPROGS_FAKE_TIME": "1700000000", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def unpack(debs: list[str], root: Path) -> Path:
    root.mkdir()
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    return root


def to_qcow2(raw: Path) -> Path:
    image = raw.with_suffix(".qcow2")
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw),
                    str(image)], check=True)
    return image


def fresh(debs: list[str], work: Path, name: str, size_mib: int) -> Path:
    """A filesystem made anew from the packages (what a from-scratch build does)."""
    root = unpack(debs, work / f"{name}-root")
    raw = work / f"{name}.raw"
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-U", UUID, "-E",
                    f"hash_seed={UUID}", "-d", str(root), str(raw), f"{size_mib}M"],
                   check=True, env=ENV, stdout=subprocess.DEVNULL)
    shutil.rmtree(root)
    return raw


def installed(v1_raw: Path, deb: str, work: Path, name: str) -> Path:
    """v1's filesystem with one more package's files written in (what installing it does)."""
    root = unpack([deb], work / f"{name}-root")
    raw = work / f"{name}.raw"
    shutil.copyfile(v1_raw, raw)
    cmds = []
    for path in sorted(root.rglob("*")):
        rel = "/" + str(path.relative_to(root))
        if path.is_symlink():
            cmds.append(f'symlink "{rel}" "{path.readlink()}"')
        elif path.is_dir():
            cmds.append(f'mkdir "{rel}"')
        else:
            cmds.append(f'write "{path}" "{rel}"')
    script = work / f"{name}.debugfs"
    script.write_text("\n".join(cmds) + "\n")
    subprocess.run(["debugfs", "-w", "-f", str(script), str(raw)], check=True, env=ENV,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    for path in files:  # every file of the package is in v2, byte for byte
        inside = subprocess.run(["debugfs", "-R", f'cat "/{path.relative_to(root)}"', str(raw)],
                                check=True, capture_output=True, env=ENV).stdout
        if inside != path.read_bytes():
            raise SystemExit(f"bench_delta_image: {path.relative_to(root)} not written into v2")
    shutil.rmtree(root)
    return raw


def rebuild(old: Path, delta: Path, out: Path, expected: str) -> float:
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "store_image_delta", REPO / "salt_states" / "_utils" / "store_image_delta.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    started = time.monotonic()
    module.rebuild(str(old), str(delta), str(out), expected)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", dest="total", action="store_const", const=20, default=150,
                        help="a ~20 MiB package set (default: ~150 MiB of .deb files)")
    args = parser.parse_args()
    total, quick = args.total, args.total == 20
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        base, extra = packages(total)
        fs_mib = total * 4 + 64
        v1_raw = fresh(base, work, "v1", fs_mib)
        rebuilt_fresh = to_qcow2(fresh([*base, extra], work, "v2fresh", fs_mib))
        v2 = to_qcow2(installed(v1_raw, extra, work, "v2"))
        v1 = to_qcow2(v1_raw)
        fresh_delta = make_delta(v1, rebuilt_fresh, work / "delta-fresh.qcow2")
        clusters = {}
        for cluster in (4096, 16384, 65536):
            delta = make_delta(v1, v2, work / f"delta-{cluster}.qcow2", cluster)
            clusters[cluster] = delta["delta_bytes"]
        best = min(clusters, key=lambda c: clusters[c])
        chosen = make_delta(v1, v2, work / "delta.qcow2", best)
        seconds = rebuild(v1, work / "delta.qcow2", work / "rebuilt.qcow2",
                          chosen["content_sha256"])
        same = subprocess.run(["qemu-img", "compare", "-q", str(v2), str(work / "rebuilt.qcow2")],
                              check=False).returncode == 0
        full = chosen["full_bytes"]
        emit({"bench": "delta_image", "quick": quick, "machine": machine(),
              "images": "ext4 (mke2fs -d) of dpkg-deb -x package trees, v2 = v1 + one package "
              "written in with debugfs (not KIWI builds)",
              "packages": len(base), "added_package": Path(extra).name,
              "full_bytes": full, "delta_bytes": clusters[best], "ratio": clusters[best] / full,
              "delta_bytes_by_cluster_size": clusters, "cluster_size": best,
              "rebuild_seconds": seconds, "rebuilt_equals_v2": same,
              # v2 made from scratch (mke2fs -d of all packages) instead: allocation shifts
              "fresh_build_delta_bytes": fresh_delta["delta_bytes"],
              "fresh_build_ratio": fresh_delta["delta_bytes"] / fresh_delta["full_bytes"]})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
