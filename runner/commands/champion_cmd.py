"""`cko champion show|select|restore`, `cko audit`, `cko report`, `cko demo`."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from ..cliutil import Outcome, common, console, fleet_options, handled, progress_console
from ..errors import Exit
from ..executor import open_executor
from ..report import gather, html_report, text, to_json
from ..store import Store
from ..workflow import ops
from ..workflow.audit import audit, junit


@click.group("champion")
def champion() -> None:
    """The current best version of a Target: chosen explicitly, never by cko itself."""


@champion.command("show")
@common
@handled
def show_cmd(store: Path, as_json: bool) -> Outcome:
    """The champion pointer and the history of selections."""
    doc = ops.show(Store(store, create=False))
    t = Table("selection", "action", "variant", "experiment", "at", title="champion history")
    for h in doc["history"]:
        t.add_row(h["id"], h["action"], h["variant"] or "(original)", h["experiment"] or "-", h["created_at"])
    cur = doc["champion"]
    head = (f"champion: {(cur.get('variant') or {}).get('id') or 'the original'} (pointer {doc['pointer_sha256'][:16]})"
            if cur else "champion: none selected (the original stands)")
    return Outcome(doc=doc, human=t, extra_human=[head])


@champion.command("select")
@click.option("--experiment", "experiment", required=True, help="A target-stage experiment that accepted.")
@click.option("--reason", default="selected by the caller", show_default=True)
@common
@handled
def select_cmd(store: Path, as_json: bool, experiment: str, reason: str) -> Outcome:
    """Make an experiment's candidate the champion. Needs a passed accuracy gate and an accepted
    target-stage primary on the same Target and a comparable identity; otherwise exit 1 naming
    the missing evidence. The pointer is replaced by compare-and-swap: two callers never both win."""
    doc, code = ops.select(Store(store, create=False), experiment, reason)
    return Outcome(doc=doc, human=f"champion: {doc['champion']['variant']['id']} (selection {doc['selection']['id']})",
                   exit_code=code)


@champion.command("restore")
@click.option("--target", "target", required=True)
@click.option("--reason", default="restored by the caller", show_default=True)
@common
@handled
def restore_cmd(store: Path, as_json: bool, target: str, reason: str) -> Outcome:
    """Point the champion back at the original."""
    doc, code = ops.restore(Store(store, create=False), target, reason)
    return Outcome(doc=doc, human=f"champion: the original (selection {doc['selection']['id']})", exit_code=code)


@click.command("audit")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@click.option("--pairs", type=int, help="Pairs for the re-run (default: as recorded).")
@fleet_options
@common
@handled
def audit_cmd(store: Path, as_json: bool, junit_path: Path | None, pairs: int | None, fleet: str | None,
              gpu_model: str | None) -> Outcome:
    """For CI: verify every hash, then re-run the original against the champion in the pinned
    image. Exit 0 when the recorded conclusion still holds, 1 when it does not."""
    con = progress_console()
    with open_executor(fleet, gpu_model) as executor:
        doc = audit(Store(store, create=False), lambda m: con.print(f"[dim]{m}[/]"), pairs=pairs, executor=executor)
    if junit_path:
        junit_path.write_bytes(junit(doc))
    t = Table("check", "ok", "detail", title="cko audit")
    for c in doc["checks"]:
        t.add_row(c["name"], "yes" if c["ok"] else "NO", c["detail"])
    return Outcome(doc=doc, human=t, extra_human=[doc["summary"]],
                   exit_code=Exit.DONE if doc["holds"] else Exit.FAILED)


@click.command("report")
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Write an HTML report with plots here.")
@common
@handled
def report_cmd(store: Path, as_json: bool, html_path: Path | None) -> Outcome:
    """A readable report of a store: Target, baseline, experiments, champion, environment."""
    st = Store(store, create=False)
    data = gather(st)
    if html_path:
        html_path.write_text(html_report(st, data))
    return Outcome(doc=to_json(data) | ({"html": str(html_path)} if html_path else {}), human=text(data))


@click.command("demo")
@click.option("--example", default="numpy-softmax", show_default=True, help="Bundled example to run.")
@common
@handled
def demo_cmd(store: Path, as_json: bool, example: str) -> Outcome:
    """The main job: the whole loop on a bundled example, in a fresh store, ending in a report.

    With no --store, a new directory under ./cko-demo/ is used.
    """
    from ..cliutil import default_store
    from ..demo import run_demo

    if Path(store) == Path(default_store()):
        store = Path("cko-demo") / time.strftime("run-%Y%m%dT%H%M%S")
    summary = run_demo(store, example, console(as_json) if not as_json else progress_console())
    t = Table("case", "pairs", "gain %", "95% CI %", "verdict", title=f"cko demo: {example}")
    for c in summary["cases"]:
        t.add_row(c["case"], str(c["pairs"]), f"{c['effect_pct']:+.2f}" if c.get("effect_pct") is not None else "-",
                  f"[{c['ci_low_pct']:+.2f}, {c['ci_high_pct']:+.2f}]" if c.get("ci_low_pct") is not None else "-",
                  str(c["verdict"]))
    lines = [f"target stage: {summary['target_outcome']}; audit: "
             f"{'the conclusion holds' if summary['audit_holds'] else 'the conclusion does NOT hold'}",
             f"store: {summary['store']}  (report.html, report.txt, audit.junit.xml)  in {summary['seconds']} s"]
    return Outcome(doc=summary, human=t, extra_human=lines)


commands = [champion, audit_cmd, report_cmd, demo_cmd]
