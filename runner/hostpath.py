"""Host paths a request names, resolved once and read by file descriptor.

The controller runs as root; a request (or a local user racing it) may name any path. So a path is
resolved once (`realpath`), checked (never under /proc, /sys, /dev ...; inside the policy's
`mount_roots`), then opened along exactly that resolved path with no symbolic link allowed in any
component (`openat2` with RESOLVE_NO_SYMLINKS, or a component-by-component O_NOFOLLOW walk where
openat2 is missing). A link swapped in after the check makes the open fail instead of escaping.
Everything after is read through that descriptor (openat below it, O_NOFOLLOW, O_NONBLOCK so a FIFO
cannot hang us) and copied into a directory cko owns; the container mounts the copy. Only regular
files and directories are taken: devices, FIFOs, sockets, symbolic links, hard-linked files and
other filesystems are refused by name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CkoError, Exit, bad_request, refused

if TYPE_CHECKING:
    from .policy import Policy

O_PATH = getattr(os, "O_PATH", 0o10000000)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
MAX_FILES = 5000
MAX_BYTES = 512 << 20
MAX_DEPTH = 64
_openat2_ok: bool | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(path: str, flags: int) -> int | None:
    """openat2(AT_FDCWD, path, flags, RESOLVE_NO_SYMLINKS); None where the kernel has no openat2."""
    global _openat2_ok
    if _openat2_ok is False:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = libc.syscall(SYS_OPENAT2, -100, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _openat2_ok = True
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_ok is None:  # EPERM: a seccomp filter without openat2
        _openat2_ok = False
        return None
    raise OSError(err, os.strerror(err), path)


def open_nofollow(real: str, flags: int = O_PATH) -> int:
    """Open an absolute, already resolved path with no symbolic link in any component."""
    fd = _openat2(real, flags)
    if fd is not None:
        return fd
    parts = [p for p in real.split("/") if p]
    cur = os.open("/", O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = os.open(
                part, (flags if last else O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur
            )
            os.close(cur)
            cur = nxt
        if not parts and flags != O_PATH:
            nxt = os.open("/", flags | os.O_CLOEXEC)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def forbidden(real: Path) -> str | None:
    from .policy import FORBIDDEN_EXACT, FORBIDDEN_UNDER

    if str(real) in FORBIDDEN_EXACT:
        return f"{real} is never allowed (it would expose the host)"
    for f in FORBIDDEN_UNDER:
        if _within(real, Path(f)):
            return f"{real} (under {f}) is never allowed"
    return None


def _kind_refusal(st: os.stat_result) -> str | None:
    m = st.st_mode
    if stat.S_ISREG(m) or stat.S_ISDIR(m):
        return None
    return {
        stat.S_ISCHR(m): "a character device",
        stat.S_ISBLK(m): "a block device",
        stat.S_ISFIFO(m): "a FIFO",
        stat.S_ISSOCK(m): "a socket",
        stat.S_ISLNK(m): "a symbolic link",
    }.get(True, "not a regular file")


@dataclass
class Opened:
    """A resolved host path held open (O_PATH): `real` is what was checked, `fd` what is read."""

    real: Path
    fd: int
    st: os.stat_result

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def resolve(path: str | Path, field: str, rule: str = "forbidden_mount") -> Opened:
    """Resolve once, refuse the never-allowed places and special files, and hold the result open."""
    raw = os.path.abspath(os.fspath(path))
    if not os.path.lexists(raw):
        raise bad_request(f"{field}: {path} does not exist", field=field)
    try:
        real = Path(os.path.realpath(raw))
    except OSError:
        # realpath's lstat-then-readlink is not atomic: a link swapped between the two raises here
        raise _changed(field, path, raw) from None
    why = forbidden(real)
    if why:
        raise refused(f"{field}: {why}", rule=rule)
    try:
        fd = open_nofollow(str(real))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EXDEV):
            raise _changed(field, path, str(real)) from None
        raise bad_request(f"{field}: cannot open {real}: {exc.strerror}", field=field) from None
    st = os.fstat(fd)
    kind = _kind_refusal(st)
    if kind:
        os.close(fd)
        raise refused(f"{field}: {real} is {kind}; only regular files and directories are taken", rule=rule)
    return Opened(real, fd, st)


def _changed(field: str, path: str | Path, where: str) -> CkoError:
    return refused(
        f"{field}: {path} changed while cko checked it (a symbolic link appeared or vanished in "
        f"{where}); nothing was read",
        rule="path_changed",
    )


def check_roots(policy: Policy, op: Opened, origin: str, field: str) -> None:
    if policy.mount_roots is None:
        return
    roots = [Path(r).resolve() for r in policy.mount_roots]
    if not any(_within(op.real, r) for r in roots):
        raise refused(
            f"{field}: {origin} resolves to {op.real}, outside the allowed roots "
            f"{', '.join(str(r) for r in roots)}",
            rule="mount_roots",
        )


def reopen(fd: int, flags: int = os.O_RDONLY) -> int:
    """A readable descriptor for the very inode an O_PATH descriptor holds (no path lookup)."""
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NONBLOCK)


def _check_file(st: os.stat_result, rel: str, field: str) -> None:
    kind = _kind_refusal(st)
    if kind:
        raise refused(
            f"{field}: {rel} is {kind}; only regular files and directories are taken", rule="forbidden_mount"
        )
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        # A hard link can name a file the caller could not read by its other name: never followed.
        raise refused(
            f"{field}: {rel} is a hard link ({st.st_nlink} names); copy it to a plain file",
            rule="forbidden_mount",
        )


def read_all(fd: int, limit: int, what: str, field: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        total += len(b)
        if total > limit:
            raise bad_request(f"{field}: {what} is larger than {limit >> 20} MiB", field=field)
        chunks.append(b)


@dataclass
class Entry:
    rel: str
    st: os.stat_result
    fd: int  # readable (regular files only); closed by the walker after the consumer returns
    link: str | None = None  # with links=True: a symbolic link's text (fd is -1; never followed)


def walk(
    root: Opened,
    field: str,
    *,
    skip: Callable[[str, bool], bool] = lambda _r, _d: False,
    max_files: int = MAX_FILES,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    strict: bool = True,
    links: bool = False,
) -> Iterator[Entry]:
    """Regular files under a held directory, by descriptor, sorted, iteratively, within bounds.

    strict: refuse links, specials and other filesystems (else skip them). `skip(rel, is_dir)`."""
    files = total = 0
    stack: list[tuple[int, str, int]] = [(reopen(root.fd, os.O_RDONLY | os.O_DIRECTORY), "", 0)]
    try:
        while stack:
            dfd, prefix, depth = stack.pop()
            try:
                names = sorted(os.listdir(dfd))
                subdirs = []
                for name in names:
                    rel = f"{prefix}{name}"
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if skip(rel, is_dir):
                        continue
                    if st.st_dev != root.st.st_dev:
                        if strict:
                            raise refused(f"{field}: {rel} is on another filesystem", rule="forbidden_mount")
                        continue
                    if is_dir:
                        if depth + 1 > max_depth:
                            raise bad_request(
                                f"{field}: {rel} is deeper than {max_depth} levels", field=field
                            )
                        subdirs.append((name, rel))
                        continue
                    if links and stat.S_ISLNK(st.st_mode):
                        yield Entry(rel, st, -1, os.readlink(name, dir_fd=dfd))
                        continue
                    if strict:
                        _check_file(st, rel, field)
                    elif not stat.S_ISREG(st.st_mode):
                        continue
                    files += 1
                    total += st.st_size
                    if files > max_files or total > max_bytes:
                        raise bad_request(
                            f"{field}: more than {max_files} files or {max_bytes >> 20} MiB", field=field
                        )
                    ffd = os.open(
                        name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                    )
                    try:
                        fst = os.fstat(ffd)
                        if (fst.st_ino, fst.st_dev) != (st.st_ino, st.st_dev) or not stat.S_ISREG(
                            fst.st_mode
                        ):
                            raise refused(f"{field}: {rel} changed while cko read it", rule="path_changed")
                        yield Entry(rel, fst, ffd)
                    finally:
                        os.close(ffd)
                for name, rel in reversed(subdirs):
                    sfd = os.open(
                        name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd
                    )
                    stack.append((sfd, rel + "/", depth + 1))
            finally:
                os.close(dfd)
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)


def copy_in(op: Opened, dest: Path, field: str) -> Path:
    """Copy a held file or directory into `dest` (cko's), read-only for the container."""
    if stat.S_ISREG(op.st.st_mode):
        _check_file(op.st, str(op.real), field)
        dest.parent.mkdir(parents=True, exist_ok=True)
        rfd = reopen(op.fd)
        try:
            data = read_all(rfd, MAX_BYTES, str(op.real), field)
        finally:
            os.close(rfd)
        dest.write_bytes(data)
        dest.chmod(0o555 if op.st.st_mode & 0o111 else 0o444)
        return dest
    dest.mkdir(parents=True)
    dirs = []
    for e in walk(op, field, links=True):
        p = dest / e.rel
        if not p.parent.exists():
            p.parent.mkdir(parents=True)
            dirs.append(p.parent)
        if e.link is not None:
            p.symlink_to(e.link)  # the link itself: inside the container it names the container's paths
            continue
        p.write_bytes(read_all(e.fd, MAX_BYTES, e.rel, field))
        p.chmod(0o555 if e.st.st_mode & 0o111 else 0o444)
    for d in sorted(set(dirs), key=lambda x: -len(x.parts)):
        d.chmod(0o555)
    dest.chmod(0o555)
    return dest


def admit_mount(
    policy: Policy, source: str, read_only: bool, owned: tuple[Path, ...], staging: Path | None, index: int
) -> Path:
    """Where the container will mount what `source` names: cko's own scratch as is, else a checked copy."""
    with resolve(source, "mount") as op:
        if any(_within(op.real, Path(r).resolve()) for r in owned):
            if op.st.st_uid != os.geteuid():
                raise refused(
                    f"mount: {op.real} lies in cko's scratch but is not cko's", rule="forbidden_mount"
                )
            return op.real
        check_roots(policy, op, source, "mount")
        if not read_only:
            raise bad_request(
                f"mount {source}: a host path is mounted read-only (a copy cko owns); write to "
                "/cko/out instead",
                field="mount",
            )
        if staging is None:
            raise CkoError(
                "internal: no staging directory for a host mount", exit_code=Exit.FAILED, code="internal"
            )
        return copy_in(op, staging / f"m{index}" / (op.real.name or "root"), "mount")


def read_file(path: str | Path, field: str, policy: Policy | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of one regular host file, resolved once, checked, read by descriptor."""
    with resolve(path, field, rule="forbidden_path") as op:
        if policy is not None:
            check_roots(policy, op, str(path), field)
        if not stat.S_ISREG(op.st.st_mode):
            raise bad_request(f"{field}: {path} is not a regular file", field=field)
        _check_file(op.st, str(op.real), field)
        rfd = reopen(op.fd)
        try:
            return read_all(rfd, limit, str(path), field)
        finally:
            os.close(rfd)


def open_dir(path: str | Path, field: str, policy: Policy | None = None) -> Opened:
    op = resolve(path, field, rule="forbidden_path")
    try:
        if policy is not None:
            check_roots(policy, op, str(path), field)
        if not stat.S_ISDIR(op.st.st_mode):
            raise bad_request(f"{field}: {path} is not a directory", field=field)
    except BaseException:
        op.close()
        raise
    return op


def remove_tree(path: str | Path) -> None:
    """rm -rf without recursion, without following links, with two descriptors at most.

    A container may leave a tree thousands of levels deep (longer than PATH_MAX): shutil.rmtree
    recurses and joins paths, so it would crash the controller (and the next command) on it."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _remove_under(parent, path.name)
    finally:
        os.close(parent)


def _remove_under(parent: int, top: str) -> None:
    names: list[str] = [top]  # the chain of directory names from `parent` down to `cur`
    cur = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        while True:
            os.fchmod(cur, 0o700)
            sub = None
            for name in os.listdir(cur):
                st = os.stat(name, dir_fd=cur, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = name
                    break
                os.unlink(name, dir_fd=cur)
            if sub is not None:
                nxt = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
                os.close(cur)
                cur = nxt
                names.append(sub)
                continue
            done = names.pop()
            if not names:
                os.close(cur)
                cur = -1
                os.rmdir(done, dir_fd=parent)
                return
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
            os.close(cur)
            cur = up
            os.rmdir(done, dir_fd=cur)
    finally:
        if cur >= 0:
            os.close(cur)
