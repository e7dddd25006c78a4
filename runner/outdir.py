"""/cko/out: a size-limited area per invocation, and its bounded collection.

As root (the controller's normal case) the output directory is a tmpfs mounted by cko on the host
with `size=` (bytes) and `nr_inodes=` (files and directories): a workload that writes more gets
ENOSPC inside the container and the host's disk is never touched. Its pages are charged to the
container's memory cgroup too. Collection walks it without recursion, to a bounded depth and count,
and records why it stopped; the area is then unmounted (a tree of any depth goes with it).
Without root, no mount is possible: the directory is a plain one, bounded only at collection, and
the invocation's events say so.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
from pathlib import Path
from typing import Any

from .hostpath import remove_tree
from .models import ObjectRef
from .records import Limits
from .store import Store

META_DIR = ".cko"
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
FS_NAME = b"cko-out"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def make(scratch: Path, user: str, limits: Limits) -> tuple[Path, bool]:
    """Create scratch/out for the container user; (path, bounded by a mount)."""
    out = scratch / "out"
    out.mkdir(parents=True)
    uid, _, gid = user.partition(":")
    if os.geteuid() != 0:
        os.chmod(out, 0o777)
        return out, False
    opts = (
        f"size={limits.output_bytes},nr_inodes={limits.output_files + 16},mode=0700,"
        f"uid={int(uid)},gid={int(gid or uid)}"
    ).encode()
    if _libc().mount(FS_NAME, str(out).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {out}: {os.strerror(err)}")
    return out, True


def copy_regular(src: Path, dst: Path, label: str) -> list[str]:
    """Copy one file a container wrote, only if it is a regular file (no link followed), into an
    output area; a missing file or a full area is a problem named by `label`, not an exception."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return [f"{label}: not written"]
    except OSError as exc:
        return [f"{label}: not a regular file ({exc.strerror})"]
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return [f"{label}: not a regular file"]
        with os.fdopen(os.dup(fd), "rb") as f, open(dst, "xb") as out:
            while chunk := f.read(1 << 20):
                out.write(chunk)
    except OSError as exc:
        dst.unlink(missing_ok=True)
        return [f"{label}: {exc.strerror or exc}"]
    finally:
        os.close(fd)
    return []


def is_mounted(path: Path) -> bool:
    target = str(path)
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4 and parts[4].replace("\\040", " ") == target:
                return True
    return False


def release(scratch: Path) -> None:
    """Unmount the output area (if mounted) and remove the scratch tree, any depth, no recursion."""
    out = scratch / "out"
    while is_mounted(out):
        if _libc().umount2(str(out).encode(), MNT_DETACH) != 0:
            break
    remove_tree(scratch)


def stale_mounts(store_root: Path) -> list[Path]:
    """cko-out mounts under a store's scratch (left by a controller that died)."""
    prefix = str(store_root / "scratch") + "/"
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4 and parts[4].startswith(prefix) and parts[4].endswith("/out"):
                found.append(Path(parts[4]))
    return found


class _Walk:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.files = 0
        self.bytes = 0
        self.problems: list[str] = []
        self.stopped = False

    def note(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)


def collect(store: Store, out: Path, limits: Limits) -> tuple[list[ObjectRef], dict[str, Any], list[str]]:
    """Hash regular files under out into objects/, within the limits; why anything was left, recorded."""
    w = _Walk(limits)
    refs: list[ObjectRef] = []
    meta: dict[str, Any] = {}
    max_files = limits.output_files or 10_000
    max_bytes = limits.output_bytes or (1 << 30)
    max_depth = limits.output_depth or 64
    stack: list[tuple[int, str, int]] = [(os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW), "", 0)]
    try:
        while stack and not w.stopped:
            dfd, prefix, depth = stack.pop()
            try:
                subdirs = _collect_dir(
                    store, dfd, prefix, depth, w, refs, meta, (max_files, max_bytes, max_depth)
                )
                for name, rel in reversed(subdirs):
                    stack.append(
                        (
                            os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd),
                            rel + "/",
                            depth + 1,
                        )
                    )
            finally:
                os.close(dfd)
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)
    with contextlib.suppress(OSError):
        sv = os.statvfs(out)
        if is_mounted(out) and (sv.f_bavail == 0 or sv.f_favail == 0):
            w.note(
                f"output area full ({limits.output_bytes} bytes, {limits.output_files} files): writes past "
                "the bound failed inside the container"
            )
    return refs, meta, w.problems


def _collect_dir(
    store: Store,
    dfd: int,
    prefix: str,
    depth: int,
    w: _Walk,
    refs: list[ObjectRef],
    meta: dict[str, Any],
    bounds: tuple[int, int, int],
) -> list[tuple[str, str]]:
    max_files, max_bytes, max_depth = bounds
    subdirs = []
    for name in sorted(os.listdir(dfd)):
        rel = prefix + name
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if depth + 1 >= max_depth:
                w.note(f"{rel}: deeper than {max_depth} levels (not collected)")
            else:
                subdirs.append((name, rel))
            continue
        if not stat.S_ISREG(st.st_mode):
            w.note(f"{rel}: not a regular file (ignored)")
            continue
        w.files += 1
        w.bytes += st.st_size
        if w.files > max_files or w.bytes > max_bytes:
            w.note(
                f"output limit exceeded at {rel} ({w.files} files, {w.bytes} bytes; bound {max_files} files, "
                f"{max_bytes} bytes): rest refused"
            )
            w.stopped = True
            return []
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        try:
            if rel.startswith(META_DIR + "/"):
                with contextlib.suppress(OSError, ValueError):
                    meta[rel[len(META_DIR) + 1 :]] = json.loads(os.read(fd, 1 << 20))
                continue
            ref = store.put_fd(fd)
            refs.append(ObjectRef(sha256=ref["sha256"], size=ref["size"], name=rel))
        finally:
            os.close(fd)
    return subdirs
