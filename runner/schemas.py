"""`cko schema NAME`: JSON Schema of every request and record, for agents."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import bad_request
from .results import result_schema_entries

# name -> "module:Class"; imported on demand so a missing area does not break the others.
SCHEMAS: dict[str, str] = {
    "invocation-request": "runner.records:InvocationRequest",
    "invocation-result": "runner.records:InvocationResult",
    "identity": "runner.identity:EnvironmentIdentity",
    "policy": "runner.policy:Policy",
    "images-lock": "runner.images:ImagesLock",
    "readiness-request": "runner.workflow.requests:ReadinessRequest",
    "baseline-request": "runner.workflow.requests:BaselineRequest",
    "variant-request": "runner.workflow.requests:VariantRequest",
    "experiment-request": "runner.workflow.requests:ExperimentRequest",
    "target": "runner.workflow.records:Target",
    "baseline": "runner.workflow.records:Baseline",
    "variant": "runner.workflow.records:Variant",
    "experiment": "runner.workflow.records:Experiment",
    "selection": "runner.workflow.records:Selection",
    "stack-audit": "runner.workflow.stackrecord:StackAudit",
    "stack-audit-request": "runner.workflow.stackaudit:StackAuditRequest",
    "champion-pointer": "runner.workflow.records:ChampionPointer",
    "decision": "runner.workflow.verdicts:Decision",
    "decide-plan": "runner.workflow.verdicts:DecidePlan",
    "load-telemetry": "runner.workflow.verdicts:Telemetry",
    "driver-request": "operations.protocol:DriverRequest",
    "driver-result": "operations.protocol:DriverResult",
    "stats-result": "operations.stats:Comparison",
    "card": "knowledge.model:Card",
    "execution-map-request": "operations.evidence.execution_map:ExecutionMapRequest",
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
