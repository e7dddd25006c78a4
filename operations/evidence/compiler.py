"""The result model every compiler-evidence parse shares: per kernel, stage -> the same few facts.

`cko sass` (SASS dump, ptxas -v, resource usage), `cko sass --ptx` and `cko sass --triton` each keep
their detailed reports (`sass`, `ptxas`, `resource_usage`, `ptx`, `triton`) and fill `kernels`:
one `KernelStages` per kernel name, whose `stages` map a stage ("ttir", "ttgir", "llir", "ptx",
"sass", "ptxas", "resource_usage", "metadata") to a `StageSummary` with the fields every stage can
state in the same words. A field a stage cannot state is None (or empty), never zero.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import Facts

Stage = Literal[
    "source", "ttir", "ttgir", "llir", "ptx", "cubin", "sass", "ptxas", "resource_usage", "metadata"
]


class StageSummary(Facts):
    source_sha256: str | None = None  # the file these facts come from
    arch: str | None = None  # "sm_90a", "cuda:90", ...
    operations: int | None = None  # IR ops, PTX or SASS instructions
    virtual_registers: int | None = None  # PTX .reg declared (virtual)
    registers: int | None = None  # per thread, allocated by ptxas
    shared_static_bytes: int | None = None
    shared_bytes: int | None = None  # Triton metadata: the launch's shared memory
    spill_bytes: int | None = None  # ptxas spill stores + loads
    tensor_core: dict[str, int] = Field(default_factory=dict)
    async_copy: dict[str, int] = Field(default_factory=dict)
    tma: dict[str, int] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)


class KernelStages(Facts):
    name: str
    stages: dict[Stage, StageSummary]
    mismatches: list[str] = Field(default_factory=list)  # stages that disagree (name, arch, warps)


def merge(kernels: list[KernelStages], name: str, stage: Stage, summary: StageSummary) -> None:
    """Add one stage's summary under its kernel, keeping the kernels in first-seen order."""
    for k in kernels:
        if k.name == name and stage not in k.stages:
            k.stages[stage] = summary
            return
    kernels.append(KernelStages(name=name, stages={stage: summary}))
