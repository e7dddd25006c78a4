"""`cko repair`: bring a store damaged by a crash or a full disk back to a verified state.

Committed records are never lost: a record is committed when its ledger line is (runner/ledger.py).
What a crash can leave, and what repair does with it:
- a partial last ledger line (the append was cut): dropped, it committed nothing;
- a record file with no ledger line (cut between the two writes): moved to quarantine/, it was
  never committed (an invocation whose result is quarantined is then recorded `abandoned`);
- temp files of interrupted writes: removed;
- a selection committed but the champion pointer not yet swapped: the swap is completed (the
  selection names the pointer it replaced, so this is exact);
- output areas and scratch of invocations whose controller died: unmounted and removed.
Damage a crash cannot cause (an altered record, a line in the middle of the ledger) is reported
by verify, not "repaired".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from . import outdir
from .canonical import canonical_bytes, sha256_bytes
from .hostpath import remove_tree
from .invocation import active_lock, reap_orphans
from .ledger import _last_line
from .store import RECORD_KINDS, Store, write_replace
from .verify import verify_store


def _record_files(store: Store) -> list[Path]:
    files = [p for k in RECORD_KINDS for p in sorted(store.kind_dir(k).glob("*.json"))]
    files += sorted(store.selections_dir.glob("*.json"))
    files += sorted(
        p / "result.json" for p in store.invocations_dir.iterdir() if (p / "result.json").exists()
    )
    return files


def _ledger_tail(store: Store, actions: list[str]) -> None:
    path = store.ledger_path
    if not path.exists():
        return
    data = path.read_bytes()
    _, committed = _last_line(data)
    if committed != len(data):
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, committed)
            os.fsync(fd)
        finally:
            os.close(fd)
        actions.append(f"ledger.jsonl: dropped a partial last line ({len(data) - committed} bytes)")


def _quarantine(store: Store, actions: list[str]) -> None:
    ledgered = {str(e.get("path")) for e in store.ledger()}
    qdir = store.quarantine_dir(time.strftime("%Y%m%dT%H%M%S", time.gmtime()))
    for p in _record_files(store):
        rel = str(p.relative_to(store.root))
        if rel in ledgered:
            continue
        dest = qdir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, dest)
        actions.append(f"{rel}: no ledger line (never committed): moved to {dest.relative_to(store.root)}")


def _temps(store: Store, actions: list[str]) -> None:
    for sub in ("objects", *RECORD_KINDS, "champion", "invocations"):
        for p in store.at(sub).rglob(".tmp-*"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
                actions.append(f"{p.relative_to(store.root)}: interrupted write removed")


def _unstarted(store: Store, actions: list[str]) -> None:
    """An invocation directory with no request.json: its request write failed (a full disk); nothing
    was committed or run under it."""
    for d in sorted(store.invocations_dir.iterdir()):
        if d.is_dir() and not (d / "request.json").exists() and not active_lock(store, d.name).is_held():
            remove_tree(d)
            actions.append(f"invocations/{d.name}: never started (no request.json): removed")


def _champion(store: Store, actions: list[str]) -> None:
    p = store.champion_path
    current = sha256_bytes(p.read_bytes()) if p.is_file() else None
    for e in reversed(store.ledger()):
        path = str(e.get("path", ""))
        if not path.startswith("champion/selections/"):
            continue
        sel = json.loads(store.at(path).read_bytes())
        ptr_doc = json.loads(p.read_bytes()) if p.is_file() else None
        if ptr_doc and ptr_doc.get("selection", {}).get("id") == sel.get("id"):
            return
        if sel.get("previous_pointer_sha256") == current:
            from .workflow.records import ChampionPointer

            ptr = ChampionPointer.model_validate(
                {
                    "target": sel["target"],
                    "variant": sel.get("variant"),
                    "selection": {"id": sel["id"], "sha256": e["sha256"]},
                    "snapshot": sel["snapshot"],
                }
            )
            write_replace(p, canonical_bytes(ptr))
            actions.append(f"champion/current.json: completed the swap to selection {sel['id']}")
        return


def _scratch(store: Store, actions: list[str]) -> None:
    for m in outdir.stale_mounts(store.root):
        inv = m.parent.name
        if not (inv.startswith("inv-") and active_lock(store, inv).is_held()):
            outdir.release(m.parent)
            actions.append(f"scratch/{inv}: stale output area unmounted and removed")
    scratch = store.scratch()
    for d in sorted(scratch.iterdir()) if scratch.is_dir() else []:
        if d.name.startswith("inv-") and active_lock(store, d.name).is_held():
            continue
        if d.name.startswith("inv-") and not (store.invocation_result(d.name)).exists():
            continue  # reap_orphans records it first
        remove_tree(d)
        actions.append(f"scratch/{d.name}: removed")


def repair(store: Store) -> dict[str, Any]:
    actions: list[str] = []
    with store.writer(), store._ledger_lock.hold(timeout=30, what="store ledger"):
        _ledger_tail(store, actions)
        _temps(store, actions)
        _quarantine(store, actions)
        _unstarted(store, actions)
        _champion(store, actions)
    reaped = reap_orphans(store)
    actions += [f"invocations/{i}: recorded abandoned" for i in reaped]
    _scratch(store, actions)
    rep = verify_store(store)
    return {"ok": rep["ok"], "actions": actions, "verify": rep}
