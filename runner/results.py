"""The JSON documents commands print with --json: one envelope, one result schema per command.

Every document carries `ok` (exit code 0), `command` ("champion select"), `exit_code` and `schema`
(the name `cko schema NAME` prints); an error document adds `error` (a code), `message`, `field`
and `detail`. Results keep their keys at the top level next to the envelope, so a script reads
`doc["target"]["id"]` and checks `doc["ok"]`. Result models are open (extra keys allowed): they pin
the keys scripts rely on, and `tests/test_cli_contract.py` validates every command's output.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .records import InvocationResult


class Envelope(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    ok: bool = Field(description="true exactly when exit_code is 0")
    command: str = Field(description="the command path without the program name, e.g. 'champion select'")
    exit_code: int = Field(
        description="the process exit code: 0 done, 1 failed, 2 bad request, 3 refused, "
        "4 timed out, 5 unavailable, 130 interrupted"
    )
    schema_: str = Field(
        alias="schema", description="the schema this document validates against (cko schema NAME)"
    )


class ErrorDoc(Envelope):
    """Any command's error: usage (exit 2), refusal, timeout, internal error, interrupt (130)."""

    ok: Literal[False]
    error: str = Field(
        description="a stable code: bad_request, usage, invalid_request, internal, interrupted, ..."
    )
    message: str
    field: str | None = Field(default=None, description="the request field or option it concerns")
    detail: dict[str, Any] = Field(default_factory=dict)


Obj = dict[str, Any]


class RefDoc(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    sha256: str


class ReadinessResult(Envelope):
    ready: bool
    target: RefDoc | None = None
    blockers: list[Obj] = Field(default_factory=list)
    ran_on: list[Obj] = Field(
        default_factory=list, description="where the smoke ran (one entry per invocation)"
    )


class BaselineResult(Envelope):
    baseline: RefDoc
    resolution_pct: float
    min_effect_resolvable: bool
    measured_under_load: bool
    cases: list[Obj]
    ran_on: list[Obj]


class VariantResult(Envelope):
    variant: RefDoc
    snapshot: str
    changed: list[str]
    identical_to_parent: bool


class CaseRow(BaseModel):
    model_config = ConfigDict(extra="allow")
    case: str
    pairs: int
    case_verdict: str | None
    stage_outcome: str
    effect_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    reference_median: float | None = None
    candidate_median: float | None = None


class ExperimentResult(Envelope):
    experiment: RefDoc
    stage: Literal["screen", "target", "audit"]
    stage_outcome: str
    primary_verdict: str
    reasons: list[Obj]
    reason_codes: list[str]
    supports: Obj
    ran_on: list[Obj]
    cases: list[CaseRow]
    cost: Obj | None = Field(default=None, description="estimated and actual cost of the stage")
    fail_on: Obj | None = Field(
        default=None, description="--fail-on: the outcomes asked for and those matched"
    )


class StatusResult(Envelope):
    invocation_id: str = Field(description="an invocation (inv-...) or a detached operation (op-...)")
    kind: Literal["invocation", "operation"]
    state: str = Field(description="running, or the terminal state")
    running: bool
    invocation: InvocationResult | None = None
    operation: Obj | None = Field(
        default=None, description="a detached operation: argv, pid, exit code, result"
    )
    events: list[Obj]


class CancelResult(Envelope):
    invocation_id: str
    state: str
    cancelled: bool


class VerifyResult(Envelope):
    problems: list[Obj]
    checked: Obj


class ChampionShowResult(Envelope):
    champions: Obj
    history: list[Obj]


class ChampionSelectResult(Envelope):
    target: str
    champion: Obj
    selection: RefDoc
    stages: list[Obj]


class ChampionRestoreResult(Envelope):
    target: str
    champion: Obj
    selection: RefDoc
    evidence: str | None


class AuditResult(Envelope):
    answer: Literal["holds", "does_not_hold", "could_not_check"]
    holds: bool
    checks: list[Obj]
    summary: str


class StackAuditResult(Envelope):
    """`cko audit --stack`: the record's reference and one row per case (facts, no promotion)."""

    stack_audit: RefDoc
    answer: Literal["measured", "could_not_check"]
    component: str
    differs: list[str]
    unchecked: list[str]
    reason_codes: list[str]
    cases: list[Obj]


class ReportResult(Envelope):
    targets: list[Obj]
    baselines: list[Obj]
    experiments: list[Obj]
    champion: Obj
    terminations: list[Obj] = Field(default_factory=list)
    handoff: str | None = Field(default=None, description="--handoff: the summary in Markdown")


class DemoResult(Envelope):
    store: str
    example: str
    target_outcome: str
    audit_answer: str
    cases: list[Obj]


class ExecResult(Envelope):
    invocation_id: str
    id: str
    state: str
    outputs: list[Obj]


class EvidenceResult(Envelope):
    invocation_id: str | None = None
    op: str | None = None
    facts: Obj | None = None
    # --collect: the collection invocation, the subject's snapshot, the kept report and the identity
    collection: Obj | None = None
    subject: Obj | None = None
    report: Obj | None = None
    identity: Obj | None = None
    parse: Obj | None = None


class StatsCompareResult(Envelope):
    """The stats-result (operations.stats.Comparison) with the envelope."""

    n_pairs: int
    effect_pct: float
    ci_low_pct: float
    ci_high_pct: float
    verdict: str
    seed: int


class DetachedResult(Envelope):
    """Any long operation run with --detach: it answers at once with the operation's id."""

    detached: Literal[True]
    invocation_id: str = Field(description="the operation id (op-...): cko status ID --wait|--follow")
    pid: int
    events: str = Field(description="path of the operation's events.jsonl")


class LsResult(Envelope):
    items: list[Obj]
    kinds: list[str]


class StopResult(Envelope):
    termination: RefDoc
    target: str | None = None
    reason: str


class CommandsResult(Envelope):
    commands: list[Obj]
    envelope: Obj
    exit_codes: dict[str, str]


class SchemaResult(Envelope):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class OpenResult(Envelope):
    """Commands whose documents are reports of their own module (doctor, images, knowledge, fleet):
    the envelope is pinned, the body is that module's report."""


# command path -> result model (the name `cko schema` serves is the path with '-' and '-result')
RESULTS: dict[str, type[Envelope]] = {
    "readiness": ReadinessResult,
    "baseline": BaselineResult,
    "variant": VariantResult,
    "experiment": ExperimentResult,
    "status": StatusResult,
    "cancel": CancelResult,
    "verify": VerifyResult,
    "champion show": ChampionShowResult,
    "champion select": ChampionSelectResult,
    "champion restore": ChampionRestoreResult,
    "audit": AuditResult,
    "report": ReportResult,
    "demo": DemoResult,
    "exec": ExecResult,
    "profile ncu": EvidenceResult,
    "profile nsys": EvidenceResult,
    "profile torch": EvidenceResult,
    "sass": EvidenceResult,
    "execution-map": EvidenceResult,
    "stats compare": StatsCompareResult,
    "ls": LsResult,
    "stop": StopResult,
    "commands": CommandsResult,
    "schema": SchemaResult,
    "doctor": OpenResult,
    "images build": OpenResult,
    "images list": OpenResult,
    "knowledge query": OpenResult,
    "knowledge lint": OpenResult,
    "fleet status": OpenResult,
    "fleet run": OpenResult,
    "fleet combine": OpenResult,
    "images save": OpenResult,
    "images load": OpenResult,
    "images push": OpenResult,
    "images pull": OpenResult,
    "repair": OpenResult,
    "reap": OpenResult,
}


def result_schema_entries() -> dict[str, str]:
    """Entries for runner.schemas.SCHEMAS: NAME-result -> module:Class."""
    out = {
        cmd.replace(" ", "-") + "-result": f"cko_perf.runner.results:{model.__name__}"
        for cmd, model in RESULTS.items()
    }
    out["error"] = "cko_perf.runner.results:ErrorDoc"
    out["detached-result"] = "cko_perf.runner.results:DetachedResult"
    out["stack-audit-result"] = "cko_perf.runner.results:StackAuditResult"
    return out
