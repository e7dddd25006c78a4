"""Advisory locks on fcntl.flock with a bounded wait that does not poll.

The wait blocks in the kernel; a one-shot interval timer interrupts it at the deadline (main
thread). Off the main thread, where signals can't be used, a short-sleep retry loop bounds the
wait instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import CkoError, Exit


class LockTimeout(CkoError):
    def __init__(self, what: str, timeout: float, holder: str | None) -> None:
        msg = f"timed out after {timeout:g}s waiting for {what}"
        if holder:
            msg += f" (held by {holder})"
        super().__init__(msg, exit_code=Exit.TIMED_OUT, code="lock_timeout", field="lock")


class _Deadline(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise _Deadline()


class FileLock:
    """An exclusive flock on a file; the holder writes its pid and a label into it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def holder(self) -> str | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            text = os.read(fd, 512).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
        return text or None

    def _acquire(self, fd: int, timeout: float) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if timeout <= 0:
                return False
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return True
            except _Deadline:
                return False
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                time.sleep(0.05)
        return False

    @contextlib.contextmanager
    def hold(self, timeout: float, what: str, label: str = "") -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a link planted where the lock file goes is refused, never truncated through.
        fd = _open_lock(self.path, os.O_RDWR | os.O_CREAT)
        try:
            if not self._acquire(fd, timeout):
                raise LockTimeout(what, timeout, self.holder())
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} {label}".strip().encode())
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def is_held(self) -> bool:
        """True if some process holds the lock now (probe without waiting)."""
        if not self.path.exists():
            return False
        fd = _open_lock(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def _open_lock(path: Path, flags: int) -> int:
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CkoError(
                f"lock {path} is a symbolic link: refused (someone planted it)",
                exit_code=Exit.UNAVAILABLE,
                code="lock_unsafe",
                field="lock",
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CkoError(
            f"lock {path} is not a regular file: refused",
            exit_code=Exit.UNAVAILABLE,
            code="lock_unsafe",
            field="lock",
        )
    return fd


def _private_dir(path: Path) -> Path:
    """Create (0700) or accept a directory only this user owns and no one else may write."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if (
        stat.S_ISLNK(st.st_mode)
        or not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & 0o022
    ):
        raise CkoError(
            f"lock directory {path} is not a private directory of uid {os.geteuid()} (a link, someone "
            "else's, or writable by others): refused",
            exit_code=Exit.UNAVAILABLE,
            code="lock_dir_unsafe",
            field="lock",
        )
    return path


def gpu_lock_dir() -> Path:
    """Host-wide GPU locks live outside any store, so two stores can't share a GPU at once.

    Never in world-writable /tmp: /run/cko/locks as root, else a private directory of this user
    ($XDG_RUNTIME_DIR/cko/locks or ~/.cache/cko/locks). $CKO_LOCK_DIR is taken only when it is
    such a private directory (tests)."""
    env = os.environ.get("CKO_LOCK_DIR")
    if env:
        return _private_dir(Path(env))
    if os.geteuid() == 0:
        return _private_dir(Path("/run/cko/locks"))
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path.home() / ".cache")
    return _private_dir(Path(base) / "cko" / "locks")


def gpu_lock(uuid: str) -> FileLock:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in uuid)
    return FileLock(gpu_lock_dir() / f"gpu-{safe}.lock")
