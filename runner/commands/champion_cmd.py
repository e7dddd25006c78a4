"""`cko champion show|select|restore`, `cko audit`, `cko report`, `cko demo`."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table

from ..cliutil import Outcome, common, console, detachable, fleet_options, handled, progress_console, say
from ..fleet import open_executor
from ..report import gather, html_report, text, to_json
from ..store import Store
from ..workflow import champion as champion_mod
from ..workflow.audit import EXIT, audit, junit


@click.group("champion")
def champion() -> None:
    """The current best version of a Target: chosen explicitly, never by cko itself."""


@champion.command("show")
@click.option("--target", "target", help="One Target's champion (default: every Target's).")
@common
@handled
def show_cmd(store: Path, as_json: bool, target: str | None) -> Outcome:
    """Each Target's champion pointer and the history of selections. A dangling pointer is exit 1."""
    doc = champion_mod.show(Store(store, create=False), target)
    t = Table(
        "selection", "target", "action", "variant", "experiment", "evidence", "at", title="champion history"
    )
    for h in doc["history"]:
        t.add_row(
            h["id"],
            h["target"],
            h["action"],
            h["variant"] or "(original)",
            h["experiment"] or "-",
            h["evidence"] or "-",
            h["created_at"],
        )
    heads = [
        f"champion of {tid}: {(c['pointer'].get('variant') or {}).get('id') or 'the original'} "
        f"(pointer {c['pointer_sha256'][:16]})"
        for tid, c in doc["champions"].items()
    ]
    return Outcome(doc=doc, human=t, extra_human=heads or ["champion: none selected (the originals stand)"])


@champion.command("select")
@click.option("--experiment", "experiment", required=True, help="The formal target stage that accepted.")
@click.option("--reason", default="selected by the caller", show_default=True)
@click.option(
    "--allow-harness-trusted",
    is_flag=True,
    help="Take evidence from a hand-written driver (the candidate shared the harness's process).",
)
@common
@handled
def select_cmd(
    store: Path, as_json: bool, experiment: str, reason: str, allow_harness_trusted: bool
) -> Outcome:
    """Make an experiment's candidate its Target's champion. Needs the formal target stage of that
    candidate with outcome accepted (primary accepted and every constraint ok), a verdict the stored
    samples give again, a passed accuracy gate and a comparable identity; otherwise exit 1 with the
    missing evidence by code. The Target's pointer is replaced by compare-and-swap."""
    doc, code = champion_mod.select(Store(store, create=False), experiment, reason, allow_harness_trusted)
    stages = ", ".join(f"{s['stage']} {s['experiment']['id']}: {s['outcome']}" for s in doc["stages"])
    return Outcome(
        doc=doc,
        human=f"champion of {doc['target']}: {doc['champion']['variant']['id']} "
        f"(selection {doc['selection']['id']})",
        exit_code=code,
        extra_human=[f"stages: {stages}", f"evidence supports: {doc['supports']['statement']}"],
    )


@champion.command("restore")
@click.option("--target", "target", required=True)
@click.option("--audit", "audit_id", help="An audit-stage experiment that did not hold for this champion.")
@click.option("--reason", default=None, help="Without --audit: the operator's reason, recorded as such.")
@common
@handled
def restore_cmd(store: Path, as_json: bool, target: str, audit_id: str | None, reason: str | None) -> Outcome:
    """Point a Target's champion back at the original: needs a rejecting audit or an explicit reason."""
    doc, code = champion_mod.restore(Store(store, create=False), target, reason, audit_id)
    return Outcome(
        doc=doc,
        human=f"champion of {target}: the original (selection {doc['selection']['id']}, "
        f"evidence {doc['evidence']})",
        exit_code=code,
    )


@click.command("audit")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@click.option("--pairs", type=int, help="Pairs for the re-run (default: as recorded).")
@fleet_options
@common
@handled
@detachable()
def audit_cmd(
    store: Path,
    as_json: bool,
    junit_path: Path | None,
    pairs: int | None,
    fleet: str | None,
    gpu_model: str | None,
) -> Outcome:
    """For CI: verify every hash and recorded verdict, then re-run the original against each Target's
    champion in the pinned image. Exit 0 holds, 1 does not hold, 5 could not check (image or
    environment unavailable, a void re-run); the JUnit file says the same (failure / error)."""
    with open_executor(fleet, gpu_model) as executor:
        doc = audit(Store(store, create=False), say, pairs=pairs, executor=executor)
    if junit_path:
        junit_path.write_bytes(junit(doc))
    t = Table("check", "answer", "code", "detail", title=f"cko audit: {doc['answer']}")
    for c in doc["checks"]:
        t.add_row(c["name"], c["answer"], c["code"], c["detail"])
    return Outcome(doc=doc, human=t, extra_human=[doc["summary"]], exit_code=EXIT[doc["answer"]])


@click.command("report")
@click.option(
    "--html", "html_path", type=click.Path(path_type=Path), help="Write an HTML report with plots here."
)
@click.option(
    "--handoff",
    "handoff_path",
    type=click.Path(path_type=Path, allow_dash=True),
    help="Write the handoff summary (Markdown, facts from the records only) here; - for stdout.",
)
@common
@handled
def report_cmd(store: Path, as_json: bool, html_path: Path | None, handoff_path: Path | None) -> Outcome:
    """A readable report of a store: Target, baseline, experiments, champion, environment. --handoff:
    conclusions, kept changes, rejected directions, gain ranges, environment, evidence gaps, why it stopped."""
    from ..handoff import handoff
    from ..store import write_replace

    st = Store(store, create=False)
    data = gather(st)
    doc = to_json(data)
    if html_path:
        write_replace(html_path, html_report(st, data).encode())
        doc["html"] = str(html_path)
    human: str = text(data)
    if handoff_path:
        doc["handoff"] = handoff(data)
        if str(handoff_path) == "-":
            human = doc["handoff"]
        else:
            write_replace(handoff_path, doc["handoff"].encode())
            doc["handoff_path"] = str(handoff_path)
    return Outcome(doc=doc, human=human)


@click.command("demo")
@click.option("--example", default="numpy-softmax", show_default=True, help="Bundled example to run.")
@common
@handled
def demo_cmd(store: Path, as_json: bool, example: str) -> Outcome:
    """The main job: the whole loop on a bundled example, in a fresh store, ending in a report.

    With no --store, a new directory under ./cko-demo/ is used.
    """
    from ..demo import run_demo

    # Only an --store the caller did not give falls back to a fresh ./cko-demo/ directory: one given
    # explicitly is used even when $CKO_STORE names the same directory.
    ctx = click.get_current_context()
    if ctx.get_parameter_source("store") is not click.core.ParameterSource.COMMANDLINE:
        store = Path("cko-demo") / time.strftime("run-%Y%m%dT%H%M%S")
    summary = run_demo(store, example, console(as_json) if not as_json else progress_console())
    t = Table(
        "case",
        "pairs",
        "gain %",
        "95% CI %",
        "case verdict",
        title=f"cko demo: {example} (target stage outcome: {summary['target_outcome']})",
    )
    for c in summary["cases"]:
        t.add_row(
            c["case"],
            str(c["pairs"]),
            f"{c['effect_pct']:+.2f}" if c.get("effect_pct") is not None else "-",
            f"[{c['ci_low_pct']:+.2f}, {c['ci_high_pct']:+.2f}]" if c.get("ci_low_pct") is not None else "-",
            str(c["case_verdict_text"]),
        )
    lines = [
        f"target stage outcome: {summary['target_outcome']}; audit: {summary['audit_answer']}",
        f"store: {summary['store']}  (report.html, report.txt, audit.junit.xml)  in {summary['seconds']} s",
    ]
    return Outcome(doc=summary, human=t, extra_human=lines)


commands = [champion, audit_cmd, report_cmd, demo_cmd]
