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


class _Findings:
    """What a verification found, and how much it checked, in the order it found it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.problems: list[dict[str, str]] = []
        self.checked = {"objects": 0, "records": 0, "invocations": 0, "references": 0}

    def bad(self, path: Path | str, what: str) -> None:
        """A problem at a store path (shown relative to the store) or at a name such as ledger.jsonl."""
        self.problems.append(
            {
                "path": str(Path(path).relative_to(self.store.root)) if isinstance(path, Path) else path,
                "problem": what,
            }
        )


def verify_store(store: Store) -> dict[str, Any]:
    found = _Findings(store)
    _check_objects(found)
    docs = _record_documents(found)
    ledgered = _check_ledger(found)
    for text in champion_problems(store):
        found.bad("champion/current.json", text)
    for p in docs:
        _check_document(found, p, ledgered)
    # issue 19: every recorded verdict recomputed from its stored samples, every champion pointer resolved
    # (a record edited by hand and re-chained into an unkeyed ledger passes the hashes, not this)
    from .workflow.recheck import recheck_store

    problems = found.problems + recheck_store(store)
    return {"ok": not problems, "problems": problems, "checked": found.checked, "store": str(store.root)}


def _check_objects(found: _Findings) -> None:
    """Every object's content must hash to its name."""
    for p in sorted(found.store.objects_dir.rglob("*")):
        if not p.is_file():
            continue
        if p.name.startswith(".tmp-"):
            continue  # an interrupted write; never referenced
        found.checked["objects"] += 1
        if sha256_file(p) != p.name:
            found.bad(p, "altered object: content does not match its name")


def _record_documents(found: _Findings) -> list[Path]:
    """The store's JSON documents to check: records, selections, pointers, and the result of each
    finished invocation (an unfinished one is a problem of its own)."""
    store = found.store
    docs: list[Path] = []
    for kind in RECORD_KINDS:
        docs += sorted(store.kind_dir(kind).glob("*.json"))
    docs += sorted(store.selections_dir.glob("*.json"))
    # the champion pointers (one per Target; current.json in stores from before pointers per Target)
    docs += sorted(store.pointers_dir.glob("*.json"))
    for d in sorted(store.invocations_dir.iterdir()) if store.invocations_dir.is_dir() else []:
        found.checked["invocations"] += 1
        res = d / "result.json"
        if not (d / "request.json").exists():
            found.bad(d, "invocation without request.json")
            continue
        if not res.exists():
            found.bad(
                d, "invocation without result.json (running, or abandoned: run any cko command to reap)"
            )
            continue
        docs.append(res)
    return docs


def _check_ledger(found: _Findings) -> set[str]:
    """The ledger's hash chain, each listed file against its entry, its keys; the paths it lists."""
    store = found.store
    ledgered: set[str] = set()
    prev = "0" * 64
    raw_lines = store.ledger_path.read_bytes().splitlines() if store.ledger_path.exists() else []
    for n, raw in enumerate(raw_lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            found.bad("ledger.jsonl", f"line {n + 1} is not JSON")
            continue
        if entry.get("prev") != prev:
            found.bad("ledger.jsonl", f"line {n + 1} breaks the hash chain (a line was changed or removed)")
        prev = sha256_bytes(raw)
        rel = str(entry.get("path"))
        ledgered.add(rel)
        fp = store.at(rel)
        if not fp.is_file():
            found.bad(rel, "missing: listed in the ledger")
        elif sha256_file(fp) != entry.get("sha256"):
            found.bad(rel, "altered: does not match its ledger entry")
    found.checked["ledger_entries"] = len(raw_lines)
    if raw_lines and not store.ledger_path.read_bytes().endswith(b"\n"):
        found.bad("ledger.jsonl", "the last line is partial (a crash or a full disk): `cko repair` drops it")
    for text in ledger.verify_keyed(store, raw_lines):
        found.bad("ledger.jsonl", text)
    return ledgered


def _check_document(found: _Findings, p: Path, ledgered: set[str]) -> None:
    """One document: in the ledger, valid JSON, and everything it references present and unaltered."""
    store = found.store
    rel = str(p.relative_to(store.root))
    if p.parent != store.pointers_dir and rel not in ledgered:  # request.json is covered by result.json
        found.bad(p, "not in the ledger (written outside cko, or the ledger was truncated)")
    found.checked["records"] += 1
    try:
        doc = json.loads(p.read_bytes())
    except (OSError, ValueError):
        found.bad(p, "not valid JSON")
        return
    if p.name == "result.json":
        _check_invocation_files(found, p.parent, doc)
    for kind, ref in _walk_refs(doc, p.name):
        found.checked["references"] += 1
        if kind == "object":
            _check_object_ref(found, p, ref)
        else:
            _check_record_ref(found, p, ref)


def _check_invocation_files(found: _Findings, d: Path, result: dict[str, Any]) -> None:
    """An invocation's request and events must match the hashes its result recorded."""
    if result.get("request_sha256") != sha256_file(d / "request.json"):
        found.bad(d / "request.json", "altered: does not match result.json's request_sha256")
    ev = d / "events.jsonl"
    if result.get("events_sha256") and (not ev.exists() or result["events_sha256"] != sha256_file(ev)):
        found.bad(ev, "altered or missing: does not match result.json's events_sha256")


def _check_object_ref(found: _Findings, p: Path, ref: dict[str, Any]) -> None:
    op = found.store.object_path(ref["sha256"])
    if not op.is_file():
        found.bad(p, f"{ref['_at']}: object {ref['sha256'][:16]} is missing")
    elif sha256_file(op) != ref["sha256"]:
        found.bad(op, "altered object")


def _check_record_ref(found: _Findings, p: Path, ref: dict[str, Any]) -> None:
    """A referenced record must be in the store with the sha256 the reference holds (ids of kinds
    this store does not keep are not checked)."""
    rp = ref_path(found.store, ref["id"])
    if rp is None:
        return
    if not rp.is_file():
        found.bad(p, f"{ref['_at']}: referenced {ref['id']} is missing")
    elif sha256_bytes(rp.read_bytes()) != ref["sha256"]:
        found.bad(rp, f"altered: referenced from {p.relative_to(found.store.root)} with another sha256")


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
