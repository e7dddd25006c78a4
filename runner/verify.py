"""`cko verify`: re-hash everything in a store and name each missing or altered file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import ledger
from .canonical import sha256_bytes, sha256_file
from .store import RECORD_KINDS, Store

PREFIX_KIND = {
    "tgt": "targets",
    "var": "variants",
    "exp": "experiments",
    "bas": "baselines",
    "sta": "stackaudits",
    "inv": "invocations",
    "sel": "selections",
}


def ref_path(store: Store, ref_id: str) -> Path | None:
    kind = PREFIX_KIND.get(ref_id.split("-", 1)[0])
    if kind is None:
        return None
    if kind == "invocations":
        return store.invocation_result(ref_id)
    if kind == "selections":
        return store.selection_path(ref_id)
    return store.kind_dir(kind) / f"{ref_id}.json"


def _walk_refs(obj: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(obj, dict):
        keys = set(obj)
        if "sha256" in keys and isinstance(obj.get("sha256"), str) and len(obj["sha256"]) == 64:
            if "id" in keys and isinstance(obj["id"], str):
                found.append(("record", obj | {"_at": where}))
            elif "size" in keys:
                found.append(("object", obj | {"_at": where}))
        for k, v in obj.items():
            found += _walk_refs(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _walk_refs(v, f"{where}[{i}]")
    return found


def verify_store(store: Store) -> dict[str, Any]:
    problems: list[dict[str, str]] = []
    checked = {"objects": 0, "records": 0, "invocations": 0, "references": 0}

    def bad(path: Path | str, what: str) -> None:
        problems.append(
            {
                "path": str(Path(path).relative_to(store.root)) if isinstance(path, Path) else path,
                "problem": what,
            }
        )

    for p in sorted(store.objects_dir.rglob("*")):
        if not p.is_file():
            continue
        if p.name.startswith(".tmp-"):
            continue  # an interrupted write; never referenced
        checked["objects"] += 1
        if sha256_file(p) != p.name:
            bad(p, "altered object: content does not match its name")
    docs: list[tuple[Path, Any]] = []
    for kind in RECORD_KINDS:
        for p in sorted(store.kind_dir(kind).glob("*.json")):
            docs.append((p, None))
    docs += [(p, None) for p in sorted(store.selections_dir.glob("*.json"))]
    # the champion pointers (one per Target; current.json in stores from before pointers per Target)
    docs += [(p, None) for p in sorted(store.pointers_dir.glob("*.json"))]
    for d in sorted(store.invocations_dir.iterdir()) if store.invocations_dir.is_dir() else []:
        checked["invocations"] += 1
        res = d / "result.json"
        if not (d / "request.json").exists():
            bad(d, "invocation without request.json")
            continue
        if not res.exists():
            bad(d, "invocation without result.json (running, or abandoned: run any cko command to reap)")
            continue
        docs.append((res, None))
    ledgered: set[str] = set()
    prev = "0" * 64
    raw_lines = store.ledger_path.read_bytes().splitlines() if store.ledger_path.exists() else []
    for n, raw in enumerate(raw_lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            bad("ledger.jsonl", f"line {n + 1} is not JSON")
            continue
        if entry.get("prev") != prev:
            bad("ledger.jsonl", f"line {n + 1} breaks the hash chain (a line was changed or removed)")
        prev = sha256_bytes(raw)
        rel = str(entry.get("path"))
        ledgered.add(rel)
        fp = store.at(rel)
        if not fp.is_file():
            bad(rel, "missing: listed in the ledger")
        elif sha256_file(fp) != entry.get("sha256"):
            bad(rel, "altered: does not match its ledger entry")
    checked["ledger_entries"] = len(raw_lines)
    if raw_lines and not store.ledger_path.read_bytes().endswith(b"\n"):
        bad("ledger.jsonl", "the last line is partial (a crash or a full disk): `cko repair` drops it")
    for text in ledger.verify_keyed(store, raw_lines):
        bad("ledger.jsonl", text)
    for text in champion_problems(store):
        bad("champion/current.json", text)
    for p, _ in docs:
        rel = str(p.relative_to(store.root))
        if p.parent != store.pointers_dir and rel not in ledgered:  # request.json is covered by result.json
            bad(p, "not in the ledger (written outside cko, or the ledger was truncated)")
        checked["records"] += 1
        try:
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError):
            bad(p, "not valid JSON")
            continue
        if p.name == "result.json":
            d = p.parent
            if doc.get("request_sha256") != sha256_file(d / "request.json"):
                bad(d / "request.json", "altered: does not match result.json's request_sha256")
            ev = d / "events.jsonl"
            if doc.get("events_sha256") and (not ev.exists() or doc["events_sha256"] != sha256_file(ev)):
                bad(ev, "altered or missing: does not match result.json's events_sha256")
        for kind, ref in _walk_refs(doc, p.name):
            checked["references"] += 1
            if kind == "object":
                op = store.object_path(ref["sha256"])
                if not op.is_file():
                    bad(p, f"{ref['_at']}: object {ref['sha256'][:16]} is missing")
                elif sha256_file(op) != ref["sha256"]:
                    bad(op, "altered object")
            else:
                rp = ref_path(store, ref["id"])
                if rp is None:
                    continue
                if not rp.is_file():
                    bad(p, f"{ref['_at']}: referenced {ref['id']} is missing")
                elif sha256_bytes(rp.read_bytes()) != ref["sha256"]:
                    bad(rp, f"altered: referenced from {p.relative_to(store.root)} with another sha256")
    # issue 19: every recorded verdict recomputed from its stored samples, every champion pointer resolved
    # (a record edited by hand and re-chained into an unkeyed ledger passes the hashes, not this)
    from .workflow.recheck import recheck_store

    problems += recheck_store(store)
    return {"ok": not problems, "problems": problems, "checked": checked, "store": str(store.root)}


def champion_problems(store: Store) -> list[str]:
    """The pointer must repeat the newest selection of its Target, field for field."""
    p = store.champion_path
    if not p.is_file():
        return []
    try:
        ptr = json.loads(p.read_bytes())
        sel_ref = ptr["selection"]
        sel_path = ref_path(store, str(sel_ref["id"]))
        sel = json.loads(sel_path.read_bytes()) if sel_path and sel_path.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return ["not a champion pointer"]
    if sel is None:
        return [f"points at selection {sel_ref.get('id')}, which is not in the store"]
    out = []
    for k in ("target", "variant", "snapshot"):
        if ptr.get(k) != sel.get(k):
            out.append(f"{k} differs from its selection {sel_ref['id']}: the pointer was edited")
    newest = None
    for line in store.ledger():
        path = str(line.get("path", ""))
        if path.startswith("champion/selections/"):
            try:
                doc = json.loads(store.at(path).read_bytes())
            except (OSError, ValueError):
                continue
            if doc.get("target") == ptr.get("target"):
                newest = doc.get("id")
    if newest is not None and newest != sel_ref["id"]:
        out.append(f"points at selection {sel_ref['id']} but the newest selection of its target is {newest}")
    return out
