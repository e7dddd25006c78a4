"""`cko doctor`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Group
from rich.table import Table

from ..cliutil import Outcome, common, handled
from ..doctor import diagnose
from ..errors import Exit


@click.command("doctor")
@common
@handled
def doctor_cmd(store: Path, as_json: bool) -> Outcome:
    """Check the engine, images, GPU passthrough modes, driver/devices and profiler permission.

    Exit 0 when the engine answers (even with no GPU: it says so), 5 when it does not.
    """
    rep = diagnose()
    t = Table("check", "status", "detail", title="cko doctor")
    eng = rep["engine"]
    t.add_row(
        "engine",
        "ok" if eng["reachable"] else "BLOCKED",
        f"Docker {eng.get('version')} ({eng.get('default_runtime')}, cgroup v{eng.get('cgroup_version')})"
        if eng["reachable"]
        else eng["reason"],
    )
    for r in rep["images"]:
        state = (
            "ok" if r.get("present") and not r.get("stale") else ("stale" if r.get("stale") else "missing")
        )
        t.add_row(f"image {r['name']}", state, (r.get("image_id") or "")[:19])
    g = rep["gpu"]
    if g["available"]:
        for d in g["devices"]:
            t.add_row(
                f"gpu {d['index']}",
                "ok",
                f"{d['name']} {d['uuid']} sm_{d['compute_capability'].replace('.', '')}",
            )
        t.add_row("driver", "ok", f"{g['driver_version']} (CUDA {g['cuda_driver_version']})")
    else:
        t.add_row("gpu", "none", g.get("note") or g.get("reason") or "")
    for p in rep["passthrough"]:
        t.add_row(f"passthrough {p['mode']}", "usable" if p["usable"] else "no", p.get("reason") or "")
    prof = rep["profiler"]
    t.add_row(
        "profiler counters",
        {True: "readable", False: "restricted", None: "-"}[prof.get("readable")],
        prof.get("reason") or "",
    )
    pr = rep.get("policy") or {}
    t.add_row(
        "policy",
        "BLOCKED" if pr.get("error") else "ok",
        pr.get("error")
        or f"system: {pr.get('system_policy')}; caller: {pr.get('caller_policy') or '-'}; "
        f"mount_roots: {pr.get('mount_roots') or 'any (except never-allowed)'}",
    )
    if not pr.get("error"):
        t.add_row("ledger key", "keyed" if pr.get("ledger_head_dir") else "-", str(pr.get("ledger_key")))
    parts: list[Any] = [t]
    if rep["blockers"]:
        b = Table("blocker", "reason", "cheapest next step", title="blockers")
        for x in rep["blockers"]:
            b.add_row(x["what"], x["reason"], x["next_step"])
        parts.append(b)
    code = Exit.UNAVAILABLE if not eng["reachable"] else Exit.DONE
    # `ok` is the envelope's boolean in every document: the checks that work are listed as `working`
    doc = {k: v for k, v in rep.items() if k != "ok"} | {"working": rep.get("ok", [])}
    return Outcome(doc=doc, human=Group(*parts), exit_code=code)


commands = [doctor_cmd]
