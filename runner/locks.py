"""Advisory locks on fcntl.flock with a bounded wait that does not poll.

The wait blocks in the kernel; a one-shot interval timer interrupts it at the deadline (main
thread). Off the main thread, where signals can't be used, a short-sleep retry loop bounds the
wait instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
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
            text = self.path.read_text().strip()
        except OSError:
            return None
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False


def gpu_lock_dir() -> Path:
    """Host-wide GPU locks live outside any store, so two stores can't share a GPU at once."""
    return Path(os.environ.get("CKO_LOCK_DIR", "/tmp/cko-locks"))


def gpu_lock(uuid: str) -> FileLock:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in uuid)
    return FileLock(gpu_lock_dir() / f"gpu-{safe}.lock")
