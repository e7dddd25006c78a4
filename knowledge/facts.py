"""The collected facts a card's check may name: `<source>.<field>` of a parser's result model.

A card that says "look at the host-to-device copies" names `torch.memcpy_summary`; lint refuses a
name no parser produces, so a check can never point at a fact cko cannot collect.
"""

from __future__ import annotations

import importlib

# source -> (module, result model): the parsers behind `cko profile ...` and `cko sass`
FACT_SOURCES: dict[str, tuple[str, str]] = {
    "torch": ("cko_perf.operations.evidence.torch_trace", "TorchTraceFacts"),
    "nsys": ("cko_perf.operations.evidence.nsys", "NsysFacts"),
    "ncu": ("cko_perf.operations.evidence.ncu", "NcuFacts"),
    "sass": ("cko_perf.operations.evidence.sass", "SassFacts"),
    "execution_map": ("cko_perf.operations.evidence.execution_map", "ExecutionMapFacts"),
}


def fact_problem(name: str) -> str | None:
    """None when `name` is `<source>.<field>` of a known result model; otherwise what is wrong."""
    source, _, field = name.partition(".")
    if source not in FACT_SOURCES or not field:
        return (
            f"fact {name!r}: expected <source>.<field> with source one of {', '.join(sorted(FACT_SOURCES))}"
        )
    module, cls = FACT_SOURCES[source]
    fields = getattr(importlib.import_module(module), cls).model_fields
    if field not in fields:
        return f"fact {name!r}: {cls} has no field {field!r}"
    return None
