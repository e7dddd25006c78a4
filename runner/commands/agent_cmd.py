"""`cko commands`, `cko ls`, `cko stop`, `cko mcp`: what agents and CI discover and script against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..catalogue import ENVELOPE_DOC, EXIT_CODES, catalogue
from ..cliutil import Outcome, common, handled
from ..errors import bad_request
from ..store import Store, check_id

LS_KINDS = ("operations", "invocations", "targets", "variants", "baselines", "experiments", "terminations")


@click.command("commands")
@common
@handled
def commands_cmd(store: Path, as_json: bool) -> Outcome:
    """The catalogue: every command with its summary, options, request and result schemas, exit codes."""
    cat = catalogue()
    t = Table("command", "request schema", "result schema", "detach", "summary", title="cko commands")
    for c in cat:
        t.add_row(
            c["name"],
            c["request_schema"] or "-",
            c["result_schema"] or "-",
            "yes" if c["detachable"] else "",
            c["summary"],
        )
    return Outcome(doc={"commands": cat, "envelope": ENVELOPE_DOC, "exit_codes": EXIT_CODES}, human=t)


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _record_items(st: Store, kind: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted(st.kind_dir(kind).glob("*.json")):
        r = _read(p)
        tgt = r.get("target")
        item = {
            "kind": kind[:-1],
            "id": p.stem,
            "created_at": r.get("created_at"),
            "target": tgt.get("id")
            if isinstance(tgt, dict)
            else (tgt or (p.stem if kind == "targets" else None)),
        }
        if kind == "experiments":
            item |= {
                "stage": r.get("stage"),
                "state": r.get("outcome"),
                "variant": (r.get("variant") or {}).get("id"),
                "mechanism_key": r.get("mechanism_key"),
            }
        elif kind == "targets":
            item |= {"name": r.get("name"), "state": r.get("mode")}
        elif kind == "variants":
            item |= {
                "state": "identical" if r.get("identical_to_parent") else "changed",
                "claim": r.get("claim"),
            }
        elif kind == "terminations":
            item |= {"state": "stopped", "reason": r.get("reason")}
        out.append(item)
    return out


def _invocation_items(st: Store) -> list[dict[str, Any]]:
    out = []
    root = st.invocations_dir
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        req, res = _read(d / "request.json"), _read(d / "result.json")
        parent = req.get("parent") or {}
        tgt = parent.get("target")
        out.append(
            {
                "kind": "invocation",
                "id": d.name,
                "created_at": req.get("created_at"),
                "op": req.get("op"),
                "label": req.get("label"),
                "state": res.get("state", "running"),
                "target": tgt.get("id") if isinstance(tgt, dict) else None,
            }
        )
    return out


def _operation_items(st: Store) -> list[dict[str, Any]]:
    from ..detach import list_ids
    from ..detach import load as load_op

    out = []
    for op_id in list_ids(st):
        try:
            op = load_op(st, op_id)
        except (OSError, ValueError, KeyError):
            continue
        out.append(
            {
                "kind": "operation",
                "id": op_id,
                "created_at": op.get("created_at"),
                "state": op["state"],
                "op": " ".join(a for a in op["argv"][:1]),
                "label": " ".join(op["argv"]),
                "target": None,
            }
        )
    return out


def list_items(st: Store, kinds: list[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for k in kinds:
        if k == "invocations":
            items += _invocation_items(st)
        elif k == "operations":
            items += _operation_items(st)
        elif st.kind_dir(k).is_dir():
            items += _record_items(st, k)
    return items


@click.command("ls")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(LS_KINDS),
    help="What to list (repeatable; default: all).",
)
@click.option("--target", "target", help="Only items of this Target.")
@click.option(
    "--state",
    "state",
    help="Only this state: an invocation's or operation's state, an experiment's "
    "stage outcome (accepted, regressed, ...).",
)
@click.option(
    "--stage", type=click.Choice(["screen", "target", "audit"]), help="Only experiments of this stage."
)
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N items.")
@common
@handled
def ls_cmd(
    store: Path,
    as_json: bool,
    kinds: tuple[str, ...],
    target: str | None,
    state: str | None,
    stage: str | None,
    limit: int | None,
) -> Outcome:
    """List operations, invocations, Targets, variants, baselines, experiments and terminations, oldest first."""
    if target:
        check_id(target, "target")
    st = Store(store, create=False)
    chosen = list(kinds) or list(LS_KINDS)
    items = list_items(st, chosen)
    if target:
        items = [i for i in items if i.get("target") == target]
    if state:
        items = [i for i in items if i.get("state") == state]
    if stage:
        items = [i for i in items if i.get("stage") == stage]
    items.sort(key=lambda i: (i.get("created_at") or "", i["id"]))
    if limit:
        items = items[-limit:]
    t = Table("kind", "id", "created", "state", "target", "detail", title=f"cko ls {st.root}")
    for i in items:
        detail = i.get("label") or i.get("name") or i.get("claim") or i.get("reason") or i.get("stage") or ""
        t.add_row(
            i["kind"],
            i["id"],
            i.get("created_at") or "-",
            str(i.get("state") or "-"),
            i.get("target") or "-",
            str(detail),
        )
    return Outcome(doc={"items": items, "kinds": chosen}, human=t)


@click.command("stop")
@click.option("--reason", required=True, help="Why the optimisation stops (recorded verbatim, immutable).")
@click.option("--target", "target", help="The Target it concerns (default: the whole store).")
@click.option("--by", "by", help="Who stops it (an agent's or person's name).")
@common
@handled
def stop_cmd(store: Path, as_json: bool, reason: str, target: str | None, by: str | None) -> Outcome:
    """Record why an optimisation stopped: a termination record (immutable, in the ledger) naming the
    champion pointer and the last experiment at that moment. Stops no process (see `cko cancel`)."""
    from ..workflow.termination import record_stop

    if not reason.strip():
        raise bad_request("reason: must not be empty", field="reason")
    doc = record_stop(Store(store, create=False), reason.strip(), target, by)
    return Outcome(doc=doc, human=f"stopped: termination {doc['termination']['id']} ({doc['reason']})")


@click.command("mcp")
@common
def mcp_cmd(store: Path, as_json: bool) -> None:
    """Serve the operations as Model Context Protocol tools over stdio (for agent frameworks).

    Each tool runs the command with --json against --store and returns its document; the tools and
    their input schemas come from `cko commands`. Needs the `mcp` package (pip install 'cko-perf[mcp]').
    """
    from ..mcp_server import serve

    serve(store)


commands = [commands_cmd, ls_cmd, stop_cmd, mcp_cmd]
