"""The compiler fact set (sass.SassFacts, alias CompilerFacts) for a PTX file or Triton kernels,
with each stage summarised per kernel in the words `cko sass` uses for SASS and ptxas."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .common import Binding, IdentityMismatch, Refusal, ReportIdentity, norm_cc
from .compiler import KernelStages, StageSummary, merge
from .mlir_stage import MlirStage
from .ptx import PtxFunction, PtxModule, parse_ptx
from .sass import CompilerFacts
from .triton_stages import TritonKernel, TritonReport, parse_triton_kernel

PARSER = "operations.evidence.compiler_evidence"
PARSER_VERSION = "1"
PTX_DIALECT = "ptx-isa-7.0..9.0"
TRITON_DIALECT = "triton-3.6-cache"


def ptx_summary(m: PtxModule, f: PtxFunction) -> StageSummary:
    return StageSummary(
        source_sha256=m.sha256,
        arch=m.target,
        operations=f.instructions,
        virtual_registers=f.registers_total,
        shared_static_bytes=m.shared_static_bytes + f.shared_static_bytes,
        tensor_core=f.tensor_core,
        async_copy=f.async_copy | f.bulk_copy,
        tma=f.tma,
        flags=f.flags,
    )


def _ir_summary(s: MlirStage) -> StageSummary:
    return StageSummary(
        source_sha256=s.sha256,
        arch=s.module_attributes.get("ttg.target"),  # TTIR names no target
        operations=s.operations,
        tensor_core=s.tensor_core,
        async_copy=s.async_copy,
        tma=s.tma,
        flags=[f"mma_v{v}" for v in s.mma_versions],
    )


def _triton_summaries(out: list[KernelStages], k: TritonKernel) -> None:
    md = k.metadata
    arch = f"{md.backend}:{md.arch}" if md.arch is not None else None
    merge(
        out,
        k.name,
        "metadata",
        StageSummary(source_sha256=k.files["json"].sha256, arch=arch, shared_bytes=md.shared),
    )
    for stage, s in k.ir.items():
        merge(out, k.name, stage, _ir_summary(s))  # type: ignore[arg-type]
    if k.llir is not None:
        asm = k.llir.inline_asm
        merge(out, k.name, "llir", StageSummary(
            source_sha256=k.llir.sha256,
            operations=None,
            tensor_core={op: n for op, n in asm.items() if op.startswith(("wgmma.mma_async", "mma.", "tcgen05.mma"))},
            async_copy={op: n for op, n in (k.llir.intrinsics | asm).items() if "cp.async" in op and "tensor" not in op},
            tma={op: n for op, n in (k.llir.intrinsics | asm).items() if "tensor" in op and "cp" in op},
        ))  # fmt: skip
    if k.ptx is not None:
        for f in k.ptx.functions:
            if f.name == k.name:
                merge(out, k.name, "ptx", ptx_summary(k.ptx, f))
    for ks in out:
        if ks.name == k.name:
            ks.mismatches = list(k.mismatches)


def _identity(archs: list[str], bound_to: Binding | None) -> tuple[ReportIdentity, list[IdentityMismatch]]:
    ccs = sorted({c for c in (norm_cc(a) for a in archs) if c})
    seen = ReportIdentity(compute_capability="; ".join(ccs) or None)
    bad: list[IdentityMismatch] = []
    if bound_to is not None and bound_to.compute_capability and ccs:
        if norm_cc(bound_to.compute_capability) not in ccs:
            bad.append(
                IdentityMismatch(
                    field="compute_capability", bound=bound_to.compute_capability, report="; ".join(archs)
                )
            )
    return seen, bad


def parse_ptx_evidence(path: str | Path, bound_to: Binding | None = None) -> CompilerFacts:
    m = parse_ptx(path)
    kernels: list[KernelStages] = []
    for f in m.functions:
        merge(kernels, f.name, "ptx", ptx_summary(m, f))
    seen, bad = _identity([m.target], bound_to)
    return CompilerFacts(
        kind="ptx", report_sha256=m.sha256, report_bytes=m.bytes, tool="ptx", tool_version=m.version,
        tool_version_source="report", parser=PARSER, parser_version=PARSER_VERSION, dialect=PTX_DIALECT,
        bound_to=bound_to, report_identity=seen, identity_mismatch=bad, ptx=m, kernels=kernels,
    )  # fmt: skip


def parse_triton_evidence(groups: list[list[Path]], bound_to: Binding | None = None) -> CompilerFacts:
    """Facts of one or more Triton kernels, each given as the list of its cache files."""
    if not groups or not all(groups):
        raise Refusal("bad_request", "give at least one kernel's files", field="triton")
    parsed = [parse_triton_kernel(g) for g in groups]
    kernels: list[KernelStages] = []
    for k in parsed:
        _triton_summaries(kernels, k)
    # The fact set's report is the set of files: its digest is over their sorted digests.
    lines = sorted(f"{b.sha256} {ext}" for k in parsed for ext, b in k.files.items())
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    total = sum(b.bytes for k in parsed for b in k.files.values())
    archs = [f"sm_{k.metadata.arch}" for k in parsed if isinstance(k.metadata.arch, int)]
    seen, bad = _identity(archs, bound_to)
    versions = sorted({k.metadata.triton_version for k in parsed})
    return CompilerFacts(
        kind="triton", report_sha256=digest, report_bytes=total, tool="triton", tool_version="; ".join(versions),
        tool_version_source="report", parser=PARSER, parser_version=PARSER_VERSION, dialect=TRITON_DIALECT,
        bound_to=bound_to, report_identity=seen, identity_mismatch=bad, triton=TritonReport(kernels=parsed),
        kernels=kernels,
    )  # fmt: skip
