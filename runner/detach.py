"""Detached operations (`--detach`) and the operation events they record.

`cko readiness|baseline|experiment|audit --detach` checks the request, writes
`operations/<op-id>/{argv.json, stdin.json?}` and starts a launcher in its own session that runs the
same command with --json, its stdout into `result.json`'s source and its exit code into `exit.json`.
The caller gets the operation id at once and follows it with `cko status op-... --follow|--wait`.

While any operation runs with `$CKO_EVENTS` set (the launcher sets it), progress lines and
structured events (each look of an experiment with its running estimate) are appended to
`events.jsonl`, one JSON object a line, fsynced, so a reader never sees half a line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .store import Store, check_id, new_id, write_new

OPS_DIR = "operations"
EVENTS_ENV = "CKO_EVENTS"
# the exit code of a finished operation, as a state word (README, exit codes)
STATE_OF_EXIT = {
    0: "succeeded",
    1: "failed",
    2: "bad_request",
    3: "refused",
    4: "timed_out",
    5: "unavailable",
    130: "interrupted",
}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def event(name: str, **data: Any) -> None:
    """Append one event to the running operation's events.jsonl; nothing when none is recorded."""
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    line = json.dumps({"t": _now(), "event": name, **data}, sort_keys=True, default=str)
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        pass  # progress is best effort: losing an event must never fail the measurement


def op_dir(store: Store, op_id: str) -> Path:
    check_id(op_id, "ID")
    return store.kind_dir(OPS_DIR) / op_id


def _with_json(argv: list[str]) -> list[str]:
    head, tail = (argv[: argv.index("--")], argv[argv.index("--") :]) if "--" in argv else (argv, [])
    head = [a for a in head if a != "--detach"]
    return head + ([] if "--json" in head else ["--json"]) + tail


def start(store: Store, argv: list[str], stdin_text: str | None) -> dict[str, Any]:
    """Record the operation and start its launcher in a new session; return its id at once."""
    op_id = new_id("op")
    d = op_dir(store, op_id)
    d.mkdir(parents=True)
    args = _with_json(argv)
    write_new(d / "argv.json", json.dumps({"argv": args, "cwd": os.getcwd(), "created_at": _now()}).encode())
    if stdin_text is not None:
        write_new(d / "stdin.json", stdin_text.encode())
    (d / "events.jsonl").touch()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cko_perf.runner.detach", str(d)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=os.getcwd(),
    )
    write_new(d / "launcher.pid", str(proc.pid).encode())
    return {
        "detached": True,
        "invocation_id": op_id,
        "pid": proc.pid,
        "events": str(d / "events.jsonl"),
        "schema": "detached-result",
        "argv": args,
    }


def _launch(d: Path) -> int:
    """The launcher: run the command, keep its document and exit code."""
    spec = json.loads((d / "argv.json").read_text())
    stdin_path = d / "stdin.json"
    env = os.environ | {EVENTS_ENV: str(d / "events.jsonl")}
    event_file = d / "events.jsonl"
    os.environ[EVENTS_ENV] = str(event_file)
    event("started", argv=spec["argv"], pid=os.getpid())
    with (
        open(d / "stdout.json", "wb") as out,
        open(d / "stderr.log", "wb") as err,
        open(stdin_path, "rb") if stdin_path.exists() else open(os.devnull, "rb") as inp,
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "cko_perf", *spec["argv"]],
            stdin=inp,
            stdout=out,
            stderr=err,
            env=env,
            cwd=spec["cwd"],
        )
        write_new(d / "child.pid", str(proc.pid).encode())

        def forward(signum: int, _frame: Any) -> None:
            proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = proc.wait()
    code = 130 if code < 0 and -code in (signal.SIGINT, signal.SIGTERM) else code
    event("ended", exit_code=code, state=STATE_OF_EXIT.get(code, "failed"))
    write_new(d / "exit.json", json.dumps({"exit_code": code, "ended_at": _now()}).encode())
    return 0


def _alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def read_events(path: Path, start: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Whole lines from byte offset `start`; returns them and the offset after the last whole line."""
    if not path.exists():
        return [], start
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "unparseable", "line": line[:200].decode(errors="replace")})
    return out, start + end


def load(store: Store, op_id: str) -> dict[str, Any]:
    """An operation's state: running, its terminal state from the exit code, or abandoned."""
    d = op_dir(store, op_id)
    spec = json.loads((d / "argv.json").read_text())
    ex = d / "exit.json"
    doc: dict[str, Any] = {"id": op_id, "argv": spec["argv"], "created_at": spec.get("created_at")}
    if ex.exists():
        e = json.loads(ex.read_text())
        doc |= {
            "state": STATE_OF_EXIT.get(e["exit_code"], "failed"),
            "exit_code": e["exit_code"],
            "ended_at": e.get("ended_at"),
            "running": False,
        }
        try:
            doc["result"] = json.loads((d / "stdout.json").read_text())
        except (OSError, ValueError):
            doc["result"] = None
    elif _alive(d / "launcher.pid"):
        doc |= {"state": "running", "exit_code": None, "running": True}
    else:
        doc |= {"state": "abandoned", "exit_code": None, "running": False}
    return doc


def list_ids(store: Store) -> list[str]:
    root = store.kind_dir(OPS_DIR)
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


if __name__ == "__main__":
    sys.exit(_launch(Path(sys.argv[1])))
