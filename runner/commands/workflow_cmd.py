"""`cko readiness|baseline|variant|experiment`: the steps of one optimisation, one at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from .. import ci
from ..cliutil import Outcome, common, detachable, fleet_options, handled, say
from ..errors import Exit
from ..fleet import open_executor
from ..invocation import reap_orphans
from ..store import Store, write_replace
from ..workflow import ops
from ..workflow.experiment import experiment
from ..workflow.requests import BaselineRequest, ExperimentRequest, ReadinessRequest, VariantRequest

REQUEST = click.option(
    "--request",
    "request",
    required=True,
    type=click.Path(path_type=Path, allow_dash=True),
    help="Request JSON (see `cko schema NAME-request`), or - for stdin; paths are relative to "
    "its directory (stdin: the working directory).",
)
TARGET = click.option("--target", "target", help="Target id (the stem of its file in the store).")


def _say(as_json: bool):  # type: ignore[no-untyped-def]
    return say


def _kv(doc: dict[str, Any], keys: list[str], title: str | None = None) -> Table:
    t = Table(show_header=False, box=None, title=title)
    for k in keys:
        if k in doc and doc[k] is not None:
            v = doc[k]
            t.add_row(k, v["id"] if isinstance(v, dict) and "id" in v else str(v))
    return t


@click.command("readiness")
@REQUEST
@fleet_options
@common
@handled
@detachable(ReadinessRequest)
def readiness_cmd(
    store: Path, as_json: bool, request: Path, fleet: str | None, gpu_model: str | None
) -> Outcome:
    """Check the workload is measurable and freeze a Target (runs the two-sample smoke).

    Not ready: the blockers with the cheapest next step, exit 1, and no Target. With --fleet the
    smoke runs on a node of the cluster, and readiness asks whether some node can run it.
    """
    req, base = ops.load_request(request, ReadinessRequest)
    st = Store(store)
    reap_orphans(st)
    with open_executor(fleet, gpu_model) as executor:
        doc, code = ops.readiness(st, req, base, _say(as_json), executor)
    if doc.get("ready"):
        human = _kv(doc, ["target", "snapshot", "smoke", "mode", "note"], title="ready: Target frozen")
    else:
        human = Table("blocker", "reason", "cheapest next step", title="not ready")
        for b in doc["blockers"]:
            human.add_row(b["what"], b["reason"], b["next_step"])
    return Outcome(doc=doc, human=human, exit_code=code)


@click.command("baseline")
@REQUEST
@TARGET
@fleet_options
@common
@handled
@detachable(BaselineRequest)
def baseline_cmd(
    store: Path, as_json: bool, request: Path, target: str | None, fleet: str | None, gpu_model: str | None
) -> Outcome:
    """Original-only samples per case, and A/A pairs that give the measurement resolution."""
    req, _ = ops.load_request(request, BaselineRequest)
    req = ops.with_ids(req, target=target)
    st = Store(store)
    reap_orphans(st)
    with open_executor(fleet, gpu_model) as executor:
        doc, code = ops.baseline(st, req, _say(as_json), executor)
    t = Table("case", "median", "unit", "A/A resolution %", title=f"baseline {doc['baseline']['id']}")
    for c in doc["cases"]:
        t.add_row(c["case"], f"{c['median']:.4g}", c["unit"], f"{c['resolution_pct']:.2f}")
    return Outcome(doc=doc, human=t, exit_code=code, extra_human=[doc["note"]])


@click.command("variant")
@REQUEST
@TARGET
@common
@handled
def variant_cmd(store: Path, as_json: bool, request: Path, target: str | None) -> Outcome:
    """Register a candidate: a snapshot of the allowed paths only (others are refused by name)."""
    req, base = ops.load_request(request, VariantRequest)
    req = ops.with_ids(req, target=target)
    st = Store(store)
    doc, code = ops.variant(st, req, base)
    return Outcome(
        doc=doc,
        human=_kv(doc, ["variant", "snapshot", "changed", "identical_to_parent", "note"]),
        exit_code=code,
    )


def experiment_table(doc: dict[str, Any]) -> Table:
    """Per-case rows under a title that carries the stage outcome; a case verdict that differs from
    the stage outcome says so in its own cell."""
    t = Table(
        "case",
        "pairs",
        "excluded",
        "reference median",
        "candidate median",
        "effect %",
        "CI %",
        "Wilcoxon p",
        "case verdict",
        title=f"{doc['stage']} {doc['experiment']['id']}: stage outcome {doc['stage_outcome_text']}",
    )
    for c in doc["cases"]:
        ci = f"[{c['ci_low_pct']:+.2f}, {c['ci_high_pct']:+.2f}]" if c.get("ci_low_pct") is not None else "-"
        med = [
            f"{c[k]:.6g}" if c.get(k) is not None else "-" for k in ("reference_median", "candidate_median")
        ]
        t.add_row(
            c["case"],
            str(c["pairs"]),
            str(c["excluded"]),
            *med,
            f"{c['effect_pct']:+.2f}" if c.get("effect_pct") is not None else "-",
            ci,
            f"{c['wilcoxon_p']:.3g}" if c.get("wilcoxon_p") is not None else "-",
            c["case_verdict_text"],
        )
    return t


@click.command("experiment")
@REQUEST
@TARGET
@click.option("--variant", "variant", help="Variant id (the candidate).")
@click.option(
    "--stage", type=click.Choice(["screen", "target", "audit"]), help="Override the request's stage."
)
@click.option(
    "--export-json",
    "export_json",
    type=click.Path(path_type=Path),
    help="CI: write the per-case results (medians, ratio, gain %, CI, verdict) as JSON here.",
)
@click.option(
    "--export-markdown",
    "export_md",
    type=click.Path(path_type=Path),
    help="CI: write the same as a Markdown table here (e.g. for a PR comment).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    help="CI: JUnit XML, one test case per case, with times.",
)
@click.option(
    "--fail-on",
    "fail_on",
    metavar="LIST",
    help="CI, opt-in: exit 1 when the stage outcome or a case verdict is one of these "
    "(comma-separated: regressed,inconclusive,below_minimum,void,constraint_violated,...).",
)
@fleet_options
@common
@handled
@detachable(ExperimentRequest)
def experiment_cmd(
    store: Path,
    as_json: bool,
    request: Path,
    target: str | None,
    variant: str | None,
    stage: str | None,
    export_json: Path | None,
    export_md: Path | None,
    junit_path: Path | None,
    fail_on: str | None,
    fleet: str | None,
    gpu_model: str | None,
) -> Outcome:
    """Run one stage of a paired comparison of a candidate against the original or the champion.

    screen: few pairs, can reject or leave open, never accept. target: the formal test, one per
    (Target, candidate snapshot, reference): once it decided anything, another is refused (exit 2,
    target_stage_final, naming it); a void one may be repeated. Exit 0 whatever the verdict; 1 when
    accuracy, integrity or the run failed. With --fleet every
    look of the stage runs on one node (and one device) of the cluster: the node of the first.
    """
    wanted = ci.parse_fail_on(fail_on)
    req, _ = ops.load_request(request, ExperimentRequest)
    req = ops.with_ids(req, target=target, variant=variant)
    if stage:
        req = req.model_copy(update={"stage": stage})
    st = Store(store)
    reap_orphans(st)
    with open_executor(fleet, gpu_model) as executor:
        doc, code = experiment(st, req, _say(as_json), executor)
    _ci_exports(st, doc, export_json, export_md, junit_path, wanted)
    if wanted:
        matched = ci.fail_on_matches(doc, wanted)
        doc["fail_on"] = {"wanted": wanted, "matched": matched}
        code = code or (int(Exit.FAILED) if matched else 0)
    notes = [f"{r['code']}: {r['message']}" for r in doc["reasons"]] + [
        f"supports: {doc['supports']['statement']}"
    ]
    if doc.get("fail_on", {}).get("matched"):
        notes.append(f"--fail-on matched: {', '.join(doc['fail_on']['matched'])} (exit 1)")
    return Outcome(doc=doc, human=experiment_table(doc), exit_code=code, extra_human=notes)


def _ci_exports(
    st: Store,
    doc: dict[str, Any],
    export_json: Path | None,
    export_md: Path | None,
    junit_path: Path | None,
    wanted: list[str],
) -> None:
    from ..canonical import canonical_bytes
    from ..workflow.common import get_target

    t, _ = get_target(st, doc["experiment_target"])
    unit = t.objective.primary.unit if t.objective else ""
    direction = t.objective.primary.direction if t.objective else "lower"
    if export_json:
        write_replace(export_json, canonical_bytes(ci.export_json(doc, unit, direction)))
    if export_md:
        write_replace(export_md, ci.export_markdown(doc, unit, direction).encode())
    if junit_path:
        write_replace(junit_path, ci.junit(doc, wanted))


commands = [readiness_cmd, baseline_cmd, variant_cmd, experiment_cmd]
