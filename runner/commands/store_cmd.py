"""`cko status`, `cko cancel`, `cko verify`, `cko schema`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.table import Table

from .. import sandbox
from ..cliutil import Outcome, common, handled
from ..errors import Exit, bad_request
from ..images import docker_client
from ..invocation import active_lock, inv_dir, load_result, reap_orphans, wait_for_result
from ..schemas import SCHEMAS, schema
from ..store import Store, check_id
from ..verify import verify_store
from .exec_cmd import invocation_table


def _events(store: Store, inv_id: str) -> list[dict]:
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
@common
@handled
def status_cmd(store: Path, as_json: bool, inv_id: str) -> Outcome:
    """Show one invocation: its terminal state, or that it is still running, with its events."""
    check_id(inv_id, "ID")
    st = Store(store, create=False)
    reap_orphans(st)
    d = inv_dir(st, inv_id)
    if not d.is_dir():
        raise bad_request(f"no invocation {inv_id} in {st.root}", field="ID")
    res = load_result(st, inv_id)
    events = _events(st, inv_id)
    doc = {"invocation_id": inv_id, "kind": "invocation", "state": res.state if res else "running",
           "running": res is None, "invocation": res.model_dump(mode="json") if res else None, "events": events}
    if res is None:
        t = Table(show_header=False, box=None)
        t.add_row("id", inv_id)
        t.add_row("state", "running")
        t.add_row("last event", events[-1]["event"] if events else "-")
        return Outcome(doc=doc, human=t)
    return Outcome(doc=doc, human=invocation_table(doc["invocation"]))


@click.command("cancel")
@click.argument("inv_id")
@click.option("--wait", "wait_s", type=float, default=30.0, show_default=True, help="Seconds to wait for the stop.")
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
        return Outcome(doc={"invocation_id": inv_id, "state": res.state, "cancelled": False, "note": "already ended"},
                       human=f"{inv_id} already ended ({res.state})")
    if not active_lock(st, inv_id).is_held():
        reaped = reap_orphans(st)
        return Outcome(doc={"invocation_id": inv_id, "cancelled": False, "state": "abandoned", "reaped": reaped},
                       human=f"{inv_id} had no live controller: recorded as abandoned")
    (d / "cancel").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    client = docker_client()
    for c in client.containers.list(all=True, filters={"label": f"{sandbox.LABEL}.invocation={inv_id}"}):
        try:
            c.kill()
        except Exception:
            pass
    res = wait_for_result(st, inv_id, wait_s)
    if res is None:
        return Outcome(doc={"invocation_id": inv_id, "cancelled": True, "state": "running", "note": "stop requested"},
                       human=f"stop requested for {inv_id}; it has not ended yet", exit_code=Exit.TIMED_OUT)
    return Outcome(doc={"invocation_id": inv_id, "cancelled": res.state == "cancelled", "state": res.state},
                   human=f"{inv_id}: {res.state}")


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
        human = (f"store {st.root}: OK — {c['objects']} objects, {c['records']} records, "
                 f"{c['invocations']} invocations, {c['references']} references checked")
    else:
        t = Table("path", "problem", title=f"store {st.root}: {len(rep['problems'])} problem(s)")
        for p in rep["problems"]:
            t.add_row(p["path"], p["problem"])
        human = t
    return Outcome(doc=rep, human=human, exit_code=Exit.DONE if rep["ok"] else Exit.FAILED)


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


commands = [status_cmd, cancel_cmd, verify_cmd, schema_cmd]
