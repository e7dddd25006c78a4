"""`cko schema NAME`: JSON Schema of every request and record, for agents."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import bad_request
from .results import result_schema_entries

# name -> "module:Class"; imported on demand so a missing area does not break the others.
SCHEMAS: dict[str, str] = {
    "invocation-request": "cko_perf.runner.records:InvocationRequest",
    "invocation-result": "cko_perf.runner.records:InvocationResult",
    "identity": "cko_perf.runner.identity:EnvironmentIdentity",
    "policy": "cko_perf.runner.policy:Policy",
    "images-lock": "cko_perf.runner.images:ImagesLock",
    "readiness-request": "cko_perf.runner.workflow.requests:ReadinessRequest",
    "baseline-request": "cko_perf.runner.workflow.requests:BaselineRequest",
    "variant-request": "cko_perf.runner.workflow.requests:VariantRequest",
    "experiment-request": "cko_perf.runner.workflow.requests:ExperimentRequest",
    "target": "cko_perf.runner.workflow.records:Target",
    "baseline": "cko_perf.runner.workflow.records:Baseline",
    "variant": "cko_perf.runner.workflow.records:Variant",
    "experiment": "cko_perf.runner.workflow.records:Experiment",
    "selection": "cko_perf.runner.workflow.records:Selection",
    "stack-audit": "cko_perf.runner.workflow.stackrecord:StackAudit",
    "stack-audit-request": "cko_perf.runner.workflow.stackaudit:StackAuditRequest",
    "champion-pointer": "cko_perf.runner.workflow.records:ChampionPointer",
    "decision": "cko_perf.runner.workflow.verdicts:Decision",
    "decide-plan": "cko_perf.runner.workflow.verdicts:DecidePlan",
    "load-telemetry": "cko_perf.runner.workflow.verdicts:Telemetry",
    "driver-request": "cko_perf.operations.protocol:DriverRequest",
    "driver-result": "cko_perf.operations.protocol:DriverResult",
    "stats-result": "cko_perf.operations.stats:Comparison",
    "card": "cko_perf.knowledge.model:Card",
    "execution-map-request": "cko_perf.operations.evidence.execution_map:ExecutionMapRequest",
}
SCHEMAS.update(result_schema_entries())


def schema(name: str) -> dict[str, Any]:
    target = SCHEMAS.get(name)
    if target is None:
        raise bad_request(f"unknown schema {name!r}; known: {', '.join(sorted(SCHEMAS))}", field="name")
    module, _, cls = target.partition(":")
    try:
        model = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        raise bad_request(
            f"schema {name!r} is not available in this build ({target})", field="name"
        ) from None
    doc: dict[str, Any] = model.model_json_schema()
    doc.setdefault("$id", f"cko:{name}")
    return doc


def available() -> list[str]:
    out = []
    for name in sorted(SCHEMAS):
        try:
            schema(name)
            out.append(name)
        except Exception:
            continue
    return out
