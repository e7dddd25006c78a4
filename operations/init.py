"""The container's PID 1: reap, forward stop signals, and end everything at the deadline.

Run as `python -I -S /opt/cko/src/operations/init.py --deadline-s S --grace-s G -- CMD...` (stdlib
only, no site: it starts in a few milliseconds). Why cko's own init rather than Docker's tini:

- The deadline is enforced from inside the container, so a container never outlives it even when
  the controller that started it was killed (nothing on the host has to be alive).
- It makes itself non-dumpable (prctl PR_SET_DUMPABLE 0): the kernel then refuses ptrace and
  /proc/1/mem to every process without CAP_SYS_PTRACE, and the workload runs with no capability,
  so it cannot trace, stop or rewrite the process that holds its deadline. SIGKILL and SIGSTOP
  sent from inside the container to PID 1 are dropped by the kernel; the other signals only reach
  the handlers below, which end the workload, never extend it.
- If PID 1 dies for any reason the kernel kills the whole PID namespace: failing closes it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_DUMPABLE = 4
DEADLINE_EXIT = 124  # like timeout(1)


def _nondumpable() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except OSError:
        pass


def _kill_all(sig: int) -> None:
    # kill(-1) from PID 1 reaches every other process of the namespace, detached ones included.
    try:
        os.kill(-1, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _State:
    child = 0
    ending_at: float | None = None
    deadline_hit = False


def _end(grace_s: float) -> None:
    if _State.ending_at is None:
        _State.ending_at = time.monotonic() + grace_s
        _kill_all(signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, max(grace_s, 0.01))
    else:
        _kill_all(signal.SIGKILL)


def _parse(argv: list[str]) -> tuple[float, float, list[str]]:
    deadline = grace = 0.0
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--deadline-s":
            deadline = float(value)
        elif flag == "--grace-s":
            grace = float(value)
        else:
            raise SystemExit(f"cko-init: unknown option {flag}")
    if not argv[1:] or deadline <= 0:
        raise SystemExit("cko-init: usage: --deadline-s S [--grace-s G] -- CMD...")
    return deadline, grace, argv[1:]


def main(argv: list[str]) -> int:
    deadline, grace, cmd = _parse(argv)
    _nondumpable()

    def on_stop(_s: int, _f: object) -> None:
        _end(grace)

    def on_alarm(_s: int, _f: object) -> None:
        if _State.ending_at is None:
            _State.deadline_hit = True
            print(
                f"cko-init: deadline of {deadline:g}s reached: ending every process",
                file=sys.stderr,
                flush=True,
            )
        _end(grace)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_stop)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    pid = os.fork()
    if pid == 0:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
            signal.signal(s, signal.SIG_DFL)
        os.setpgid(0, 0)
        try:
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            print(f"cko: cannot execute {cmd[0]}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
    _State.child = pid
    return _reap(pid)


def _reap(pid: int) -> int:
    code = 0
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if got == pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            _kill_all(signal.SIGKILL)  # the command is done: nothing it left behind outlives it
    return DEADLINE_EXIT if _State.deadline_hit else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
