"""`cko champion show|select|restore`, `cko audit`, `cko report`, `cko demo`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..cliutil import Outcome, common, console, detachable, fleet_options, handled, progress_console, say
from ..errors import bad_request
from ..fleet import open_executor
from ..report import gather, html_report, text, to_json
from ..store import Store
from ..workflow import champion as champion_mod
from ..workflow.audit import EXIT, audit, junit
from ..workflow.stackaudit import parse_request, stack_audit


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
@click.option(
    "--stack", is_flag=True, help="A stack-upgrade audit of two Targets (--from, --to, --component)."
)
@click.option("--from", "from_target", metavar="TARGET", help="--stack: the Target on the current stack.")
@click.option("--to", "to_target", metavar="TARGET", help="--stack: the Target on the upgraded stack.")
@click.option(
    "--component",
    metavar="NAME",
    help="--stack: the one component declared to differ (image, torch, triton, cuda, python, numpy, ...).",
)
@click.option("--rounds", type=int, default=6, show_default=True, help="--stack: invocations per side.")
@click.option(
    "--samples", type=int, default=3, show_default=True, help="--stack: samples per case per invocation."
)
@click.option("--seed", type=int, default=0, show_default=True, help="--stack: the bootstrap's seed.")
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
    stack: bool = False,
    from_target: str | None = None,
    to_target: str | None = None,
    component: str | None = None,
    rounds: int = 6,
    samples: int = 3,
    seed: int = 0,
) -> Outcome:
    """For CI: verify every hash and recorded verdict, then re-run the original against each Target's
    champion in the pinned image. Exit 0 holds, 1 does not hold, 5 could not check (image or
    environment unavailable, a void re-run); the JUnit file says the same (failure / error).

    With --stack: two Targets of one workload whose frozen identities differ in the declared
    --component only, both originals measured in their own images, interleaved, compared case by case
    (faster / slower / no_difference / inconclusive). Refused (exit 2, nothing written) when anything
    else differs; exit 0 measured, 5 could not check (an arm not on its Target's frozen stack)."""
    stack_opts = {"--from": from_target, "--to": to_target, "--component": component}
    if stack:
        if junit_path or pairs is not None:
            raise bad_request("--junit and --pairs belong to the champion audit, not --stack", field="stack")
        req = parse_request(
            {"from": from_target, "to": to_target, "component": component}
            | {"rounds": rounds, "samples_per_case": samples, "seed": seed}
        )
        with open_executor(fleet, gpu_model) as executor:
            doc, code = stack_audit(Store(store, create=False), req, say, executor)
        return stack_outcome(doc, code)
    given = [k for k, v in stack_opts.items() if v is not None]
    if given:
        raise bad_request(f"{', '.join(given)}: only with --stack", field=given[0].lstrip("-"))
    with open_executor(fleet, gpu_model) as executor:
        doc = audit(Store(store, create=False), say, pairs=pairs, executor=executor)
    if junit_path:
        junit_path.write_bytes(junit(doc))
    t = Table("check", "answer", "code", "detail", title=f"cko audit: {doc['answer']}")
    for c in doc["checks"]:
        t.add_row(c["name"], c["answer"], c["code"], c["detail"])
    return Outcome(doc=doc, human=t, extra_human=[doc["summary"]], exit_code=EXIT[doc["answer"]])


def stack_outcome(doc: dict[str, Any], code: int) -> Outcome:
    """The stack audit's table: per case both medians, the effect, its interval and the verdict."""
    t = Table(
        "case",
        "from median",
        "to median",
        "effect %",
        "CI %",
        "verdict",
        "A/A resolution %",
        "note",
        title=f"cko audit --stack {doc['component']}: {doc['answer']} ({doc['stack_audit']['id']})",
    )
    for c in doc["cases"]:
        res = ", ".join(f"{k} {v:.2f}" for k, v in c["aa_resolution_pct"].items() if v is not None)
        t.add_row(
            c["case"],
            f"{c['from_median']:.4g} {c['unit']}" if c["from_median"] is not None else "-",
            f"{c['to_median']:.4g} {c['unit']}" if c["to_median"] is not None else "-",
            f"{c['effect_pct']:+.2f}" if c["effect_pct"] is not None else "-",
            f"[{c['ci_low_pct']:+.2f}, {c['ci_high_pct']:+.2f}]" if c["ci_low_pct"] is not None else "-",
            c["verdict"],
            res or "no baseline",
            c["note"] or "",
        )
    lines = [
        f"differs: {', '.join(doc['differs']) or 'nothing'}; could not check: {', '.join(doc['unchecked']) or 'none'}",
        *[f"{r['code']}: {r['message']}" for r in doc["reasons"]],
        "effect: + means the 'to' stack is better in the metric's direction; cko promotes nothing",
    ]
    return Outcome(doc=doc | {"schema": "stack-audit-result"}, human=t, extra_human=lines, exit_code=code)


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
@click.option(
    "--image",
    default=None,
    help="Run it in this named image (a recipe built with `cko images build NAME`) instead of the example's.",
)
@common
@handled
def demo_cmd(store: Path, as_json: bool, example: str, image: str | None) -> Outcome:
    """The main job: the whole loop on a bundled example, in a fresh store, ending in a report.

    With no --store, a new directory under ./cko-demo/ is used.
    """
    from ..demo import run_demo

    # Only an --store the caller did not give falls back to a fresh ./cko-demo/ directory: one given
    # explicitly is used even when $CKO_STORE names the same directory.
    ctx = click.get_current_context()
    if ctx.get_parameter_source("store") is not click.core.ParameterSource.COMMANDLINE:
        store = Path("cko-demo") / time.strftime("run-%Y%m%dT%H%M%S")
    summary = run_demo(store, example, console(as_json) if not as_json else progress_console(), image=image)
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
