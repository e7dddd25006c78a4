"""`cko status`, `cko cancel`, `cko verify`, `cko repair`, `cko reap`, `cko schema`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from .. import sandbox
from ..cliutil import Outcome, common, handled, progress_console
from ..detach import load as load_op
from ..detach import op_dir, read_events
from ..errors import Exit, bad_request
from ..images import docker_client
from ..invocation import active_lock, inv_dir, load_result, reap_orphans, wait_for_result
from ..schemas import SCHEMAS, schema
from ..store import Store, check_id
from ..verify import verify_store
from .exec_cmd import invocation_table


def _events(store: Store, inv_id: str) -> list[dict[str, Any]]:
    p = inv_dir(store, inv_id) / "events.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "unparseable", "line": line[:200]})
    return out


@click.command("status")
@click.argument("inv_id")
@click.option(
    "--follow",
    is_flag=True,
    help="Print events as they arrive (stderr; JSON lines with --json) "
    "until it ends; then the document, with the operation's exit code.",
)
@click.option(
    "--wait",
    "wait",
    is_flag=True,
    help="Block until it ends; then the document, with the operation's exit code.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=None,
    help="With --follow/--wait: give up after this many seconds (exit 4, still running).",
)
@common
@handled
def status_cmd(
    store: Path, as_json: bool, inv_id: str, follow: bool, wait: bool, timeout_s: float | None
) -> Outcome:
    """Show one invocation (inv-...) or detached operation (op-...): its terminal state, or that it is
    still running, with its events. Exit 0 without --follow/--wait; with them, the operation's own
    exit code once it ends (4 when --timeout passes first)."""
    check_id(inv_id, "ID")
    st = Store(store, create=False)
    reap_orphans(st)
    is_op = inv_id.startswith("op-")
    d = op_dir(st, inv_id) if is_op else inv_dir(st, inv_id)
    if not d.is_dir():
        raise bad_request(f"no {'operation' if is_op else 'invocation'} {inv_id} in {st.root}", field="ID")
    if follow or wait:
        if not _watch(st, inv_id, d / "events.jsonl", is_op, follow, as_json, timeout_s):
            doc = _status_doc(st, inv_id, is_op)
            return Outcome(
                doc=doc, human=f"{inv_id}: still running after {timeout_s} s", exit_code=Exit.TIMED_OUT
            )
    doc = _status_doc(st, inv_id, is_op)
    code = (
        (doc["operation"]["exit_code"] if is_op else doc["invocation"]["exit_code"])
        if (follow or wait)
        else 0
    )
    return Outcome(doc=doc, human=_status_human(doc), exit_code=int(code or 0))


def _status_doc(st: Store, inv_id: str, is_op: bool) -> dict[str, Any]:
    if is_op:
        op = load_op(st, inv_id)
        events, _ = read_events(op_dir(st, inv_id) / "events.jsonl")
        return {
            "invocation_id": inv_id,
            "kind": "operation",
            "state": op["state"],
            "running": op["running"],
            "operation": op,
            "invocation": None,
            "events": events,
        }
    res = load_result(st, inv_id)
    return {
        "invocation_id": inv_id,
        "kind": "invocation",
        "state": res.state if res else "running",
        "running": res is None,
        "invocation": res.model_dump(mode="json") if res else None,
        "events": _events(st, inv_id),
    }


def _status_human(doc: dict[str, Any]) -> Table:
    if doc["invocation"] is not None:
        return invocation_table(doc["invocation"])
    t = Table(show_header=False, box=None)
    t.add_row("id", doc["invocation_id"])
    t.add_row("state", doc["state"])
    op = doc.get("operation") or {}
    if op.get("argv"):
        t.add_row("command", "cko " + " ".join(op["argv"]))
    if op.get("exit_code") is not None:
        t.add_row("exit code", str(op["exit_code"]))
    t.add_row(
        "last event", doc["events"][-1].get("message") or doc["events"][-1]["event"] if doc["events"] else "-"
    )
    return t


def _ended(st: Store, inv_id: str, is_op: bool) -> bool:
    return not load_op(st, inv_id)["running"] if is_op else load_result(st, inv_id) is not None


def _watch(
    st: Store, inv_id: str, events: Path, is_op: bool, follow: bool, as_json: bool, timeout_s: float | None
) -> bool:
    """Poll until it ends (True) or the timeout passes (False), printing new events when following."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    offset = 0
    while True:
        ended = _ended(st, inv_id, is_op)  # read before the events: the last ones are then already written
        if follow:
            new, offset = read_events(events, offset)
            for e in new:
                print_event(e, as_json)
        if ended:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def print_event(e: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stderr.write(json.dumps(e, sort_keys=True, default=str) + "\n")
        sys.stderr.flush()
        return
    detail = e.get("message") or " ".join(f"{k}={v}" for k, v in e.items() if k not in ("t", "event"))
    progress_console().print(Text(f"{e.get('t', '')} {e.get('event')}: {detail}"))


@click.command("cancel")
@click.argument("inv_id")
@click.option(
    "--wait", "wait_s", type=float, default=30.0, show_default=True, help="Seconds to wait for the stop."
)
@common
@handled
def cancel_cmd(store: Path, as_json: bool, inv_id: str, wait_s: float) -> Outcome:
    """Stop a running invocation; it is recorded as `cancelled`."""
    check_id(inv_id, "ID")
    st = Store(store, create=False)
    d = inv_dir(st, inv_id)
    if not d.is_dir():
        raise bad_request(f"no invocation {inv_id} in {st.root}", field="ID")
    res = load_result(st, inv_id)
    if res is not None:
        return Outcome(
            doc={"invocation_id": inv_id, "state": res.state, "cancelled": False, "note": "already ended"},
            human=f"{inv_id} already ended ({res.state})",
        )
    if not active_lock(st, inv_id).is_held():
        reaped = reap_orphans(st)
        return Outcome(
            doc={"invocation_id": inv_id, "cancelled": False, "state": "abandoned", "reaped": reaped},
            human=f"{inv_id} had no live controller: recorded as abandoned",
        )
    (d / "cancel").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    client = docker_client()
    for c in client.containers.list(all=True, filters={"label": f"{sandbox.LABEL}.invocation={inv_id}"}):
        try:
            c.kill()
        except Exception:
            pass
    res = wait_for_result(st, inv_id, wait_s)
    if res is None:
        return Outcome(
            doc={"invocation_id": inv_id, "cancelled": True, "state": "running", "note": "stop requested"},
            human=f"stop requested for {inv_id}; it has not ended yet",
            exit_code=Exit.TIMED_OUT,
        )
    return Outcome(
        doc={"invocation_id": inv_id, "cancelled": res.state == "cancelled", "state": res.state},
        human=f"{inv_id}: {res.state}",
    )


@click.command("verify")
@common
@handled
def verify_cmd(store: Path, as_json: bool) -> Outcome:
    """Re-hash every object and record; name each missing or altered file (exit 1 if any)."""
    st = Store(store, create=False)
    reap_orphans(st)
    rep = verify_store(st)
    human: str | Table
    if rep["ok"]:
        c = rep["checked"]
        human = (
            f"store {st.root}: OK — {c['objects']} objects, {c['records']} records, "
            f"{c['invocations']} invocations, {c['references']} references checked"
        )
    else:
        t = Table("path", "problem", title=f"store {st.root}: {len(rep['problems'])} problem(s)")
        for p in rep["problems"]:
            t.add_row(p["path"], p["problem"])
        human = t
    return Outcome(doc=rep, human=human, exit_code=Exit.DONE if rep["ok"] else Exit.FAILED)


@click.command("repair")
@common
@handled
def repair_cmd(store: Path, as_json: bool) -> Outcome:
    """Bring a store a crash or a full disk damaged back to verified, losing no committed record.

    Drops a partial ledger line, quarantines records that never got their ledger line, removes
    interrupted writes and stale output areas, completes a half-done champion swap, records dead
    invocations as abandoned. Exit 0 when the store then verifies, 1 when damage remains (named)."""
    from ..repair import repair

    st = Store(store, create=False)
    rep = repair(st)
    t = Table(
        "action",
        title=f"store {st.root}: {len(rep['actions'])} repair(s); verify {'OK' if rep['ok'] else 'FAILED'}",
    )
    for a in rep["actions"]:
        t.add_row(a)
    for p in rep["verify"]["problems"]:
        t.add_row(f"[red]left[/]: {p['path']}: {p['problem']}")
    return Outcome(doc=rep, human=t, exit_code=Exit.DONE if rep["ok"] else Exit.FAILED)


@click.command("reap")
@common
@handled
def reap_cmd(store: Path, as_json: bool) -> Outcome:
    """Remove every cko container past its deadline (any store: needs only the engine), then the
    store's orphans. Exit 5 when no engine answers."""
    client = docker_client()
    gone = sandbox.reap_expired(client)
    reaped: list[str] = []
    if Path(store).is_dir():
        reaped = reap_orphans(Store(store, create=False), client)
    return Outcome(
        doc={"expired_containers_removed": gone, "abandoned": reaped},
        human=f"{len(gone)} expired container(s) removed; {len(reaped)} invocation(s) recorded abandoned",
    )


@click.command("schema")
@click.argument("name", required=False)
@common
@handled
def schema_cmd(store: Path, as_json: bool, name: str | None) -> Outcome:
    """Print the JSON Schema of a request or record (no NAME: list the names)."""
    if not name:
        return Outcome(doc={"schemas": sorted(SCHEMAS)}, human="\n".join(sorted(SCHEMAS)))
    doc = schema(name)
    return Outcome(doc=doc, human=json.dumps(doc, indent=2))


commands = [status_cmd, cancel_cmd, verify_cmd, repair_cmd, reap_cmd, schema_cmd]
