"""`cko profile ncu|nsys|torch`, `cko sass`, `cko execution-map`: facts from profiler reports and
compiler output (DESIGN.md, Profiler and compiler evidence).

Each runs the matching in-container operation (operations/ops/profile_*.py, sass.py,
execution_map.py) in the sandbox with the report mounted read-only, as a recorded Invocation: an
`OperationRequest` handed to the executor (runner/operation.py), this host's or, with --fleet, a
node's.
Exit 0 with the facts; exit 1 when the operation refused the report (its reason and field are
printed); 2 for a bad command line; 4 on timeout; 5 when no engine or image is there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from ..cliutil import Outcome, common, fleet_options, handled, load_json_file, say
from ..errors import CkoError, Exit, bad_request, failed
from ..store import Store

if TYPE_CHECKING:  # imported when run: the executor and the fleet stay out of the CLI's start-up
    from ..operation import OperationResult

TIMEOUT_S = 600.0
REPORT_NAMES = {"ncu": "report.csv", "nsys": "report.sqlite", "torch": "trace.json"}


def _file(path: Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise bad_request(f"{what}: {p} is not a readable file", field=what)
    return p


def _snapshot(store: Store, t: Any, subject: str) -> list[str]:
    """--bind-subject/--bind-snapshot: the Target's original or one of its variants, by digest."""
    if subject == "original":
        if t.original is None:
            raise bad_request(f"subject: target {t.id} has no original snapshot", field="subject")
        return ["--bind-subject", "original", "--bind-snapshot", t.original.sha256]
    from ..store import check_id
    from ..workflow.records import Variant

    check_id(subject, "subject")
    v, _ = store.get_record("variants", subject, Variant)
    if v.target.id != t.id:
        raise bad_request(f"subject: variant {subject} belongs to {v.target.id}, not {t.id}", field="subject")
    return ["--bind-subject", subject, "--bind-snapshot", v.snapshot.sha256]


def _binding(store: Store, target_id: str | None, subject: str | None = None) -> list[str]:
    """--bind-* arguments for the operation from a Target's frozen identity (and a subject's snapshot)."""
    if not target_id:
        if subject:
            raise bad_request("--subject needs --target", field="subject")
        return []
    from ..workflow.collect import binding_args
    from ..workflow.ops import get_target

    t, _ref = get_target(store, target_id)
    return binding_args(store, target_id) + (_snapshot(store, t, subject) if subject else [])


@dataclass(frozen=True)
class Where:
    """Where a command's operations run and under which limits: the options every evidence command
    shares (--policy, --memory, --fleet, --gpu-model)."""

    store: Path
    policy: Path | None
    memory: str
    fleet: str | None = None
    gpu_model: str | None = None


def _run(
    where: Where, op: str, args: list[str], inputs: dict[str, Path], image: str, label: str
) -> OperationResult:
    """One evidence operation through the executor seam: this host, or the --fleet's node."""
    from ..fleet import open_executor
    from ..operation import OperationRequest, run_operation

    req = OperationRequest(
        op=op,
        args=args,
        inputs=inputs,
        image=image,
        timeout_s=TIMEOUT_S,
        label=label,
        memory=where.memory,
        policy_path=str(where.policy) if where.policy else None,
    )
    with open_executor(where.fleet, where.gpu_model) as executor:
        return run_operation(Store(where.store), req, executor)


def _finish(result: OperationResult, op: str, human: Any) -> Outcome:
    """Map an OperationResult to an Outcome: facts, a refusal (exit 1), or an error."""
    if result.state == "timed_out":
        raise CkoError(
            f"{op}: timed out after {TIMEOUT_S:.0f} s (invocation {result.invocation_id})",
            exit_code=Exit.TIMED_OUT,
            code="timed_out",
        )
    doc = result.doc
    if doc is None:
        tail = result.stderr_tail.strip()[-400:]
        raise failed(
            f"{op}: the operation wrote no result (container exit {result.exit_code}, "
            f"invocation {result.invocation_id}){': ' + tail if tail else ''}",
            code="operation_failed",
        )
    if "error" in doc:
        out = {
            "invocation_id": result.invocation_id,
            "op": op,
            "refused": True,
            "error": doc.get("error"),
            "message": doc.get("message"),
            "field": doc.get("field"),
        }
        text = Text.assemble(("refused", "bold red"), f" ({doc.get('error')}): {doc.get('message')}")
        if doc.get("field"):
            text.append(f"  (field: {doc.get('field')})", style="dim")
        return Outcome(doc=out, human=text, exit_code=Exit.FAILED)
    out = {
        "invocation_id": result.invocation_id,
        "op": op,
        "facts": doc,
        "outputs": [o.model_dump(mode="json") for o in result.outputs],
    }
    return Outcome(doc=out, human=human(doc, result.invocation_id))


# ---------------------------------------------------------------------------------------------
# Human renderings (the facts as they are; no advice)


def _us(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1000:.2f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _head(doc: dict[str, Any], inv: str) -> str:
    lines = [
        f"{doc.get('tool')} {doc.get('tool_version') or '(version not given)'} · dialect {doc.get('dialect')} · "
        f"report sha256 {str(doc.get('report_sha256'))[:16]}… · invocation {inv}"
    ]
    for m in doc.get("identity_mismatch") or []:
        lines.append(f"IDENTITY MISMATCH {m['field']}: bound {m['bound']!r}, report {m['report']!r}")
    return "\n".join(lines)


def _human_ncu(doc: dict[str, Any], inv: str) -> Any:
    t = Table(title=_head(doc, inv), title_justify="left")
    for c in ("id", "kernel", "grid", "block", "us", "SM %", "DRAM %", "occ %", "regs", "L1 %", "L2 %"):
        t.add_column(c)
    for la in doc.get("launches", [])[:200]:
        t.add_row(
            str(la["id"]),
            la["name"][:60],
            "x".join(map(str, la["grid"])),
            "x".join(map(str, la["block"])),
            _us(la.get("duration_ns")),
            _pct(la.get("sm_throughput_pct")),
            _pct(la.get("dram_throughput_pct")),
            _pct(la.get("achieved_occupancy_pct")),
            "-" if la.get("registers_per_thread") is None else str(la["registers_per_thread"]),
            _pct(la.get("l1_hit_rate_pct")),
            _pct(la.get("l2_hit_rate_pct")),
        )
    if doc.get("limitation"):
        t.caption = f"limitation: {doc['limitation']} (counter facts are absent, not zero)"
    return t


def _summary_table(title: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in ("name", "count", "total us", "min us", "max us"):
        t.add_column(c)
    for r in rows[:25]:
        t.add_row(
            str(r["name"])[:80], str(r["count"]), _us(r["total_ns"]), _us(r["min_ns"]), _us(r["max_ns"])
        )
    return t


def _human_nsys(doc: dict[str, Any], inv: str) -> Any:
    t = _summary_table(
        _head(doc, inv) + f"\nschema {doc.get('schema_version')} · kernels", doc.get("kernel_summary", [])
    )
    t.caption = "rows per table: " + ", ".join(f"{k} {v}" for k, v in sorted(doc.get("counts", {}).items()))
    return t


def _human_torch(doc: dict[str, Any], inv: str) -> Any:
    t = _summary_table(_head(doc, inv) + "\nkernels", doc.get("kernel_summary", []))
    t.caption = (
        f"{doc.get('events')} events; GPU events {doc.get('gpu_events')}, correlated to a launch "
        f"{doc.get('gpu_events_correlated')}; CUDA runtime {doc.get('cuda_runtime_version')}"
    )
    return t


def _human_sass(doc: dict[str, Any], inv: str) -> Any:
    t = Table(title=_head(doc, inv), title_justify="left")
    for c in ("function", "arch", "insts", "regs", "stack", "spill st/ld", "flags"):
        t.add_column(c)
    ptx = {(f["name"], f["arch"]): f for f in ((doc.get("ptxas") or {}).get("functions") or [])}
    res = {(f["name"], f["arch"]): f for f in ((doc.get("resource_usage") or {}).get("functions") or [])}
    sass_fns = (doc.get("sass") or {}).get("functions") or []
    keys = [(f["name"], f["arch"]) for f in sass_fns] or list(ptx) or list(res)
    by_key = {(f["name"], f["arch"]): f for f in sass_fns}
    for k in keys:
        s, p, r = by_key.get(k), ptx.get(k), res.get(k)
        regs = (
            p["registers"] if p and p.get("registers") is not None else (r or {}).get("values", {}).get("REG")
        )
        stack = p["stack_frame_bytes"] if p else (r or {}).get("values", {}).get("STACK")
        spills = (
            f"{p['spill_stores_bytes']}/{p['spill_loads_bytes']}"
            if p and p.get("spill_stores_bytes") is not None
            else "-"
        )
        t.add_row(
            k[0][:60],
            str(k[1]),
            str(s["instructions"]) if s else "-",
            "-" if regs is None else str(regs),
            "-" if stack is None else str(stack),
            spills,
            ", ".join(s["flags"]) if s else "",
        )
    return t


def _human_stages(doc: dict[str, Any], inv: str) -> Any:
    t = Table(title=_head(doc, inv), title_justify="left")
    for c in ("kernel", "stage", "arch", "ops", "vregs/regs", "tensor core", "async copy", "tma"):
        t.add_column(c)
    order = ("metadata", "source", "ttir", "ttgir", "llir", "ptx", "ptxas", "resource_usage", "sass")
    for k in doc.get("kernels", []):
        stages = sorted(k["stages"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
        for stage, s in stages:
            regs = s.get("registers") if s.get("registers") is not None else s.get("virtual_registers")
            t.add_row(
                k["name"][:50], stage, str(s.get("arch") or "-"),
                "-" if s.get("operations") is None else str(s["operations"]),
                "-" if regs is None else str(regs),
                ", ".join(f"{op} x{n}" for op, n in list(s["tensor_core"].items())[:2]),
                str(sum(s["async_copy"].values()) or ""), str(sum(s["tma"].values()) or ""),
            )  # fmt: skip
        for m in k.get("mismatches", []):
            t.add_row(k["name"][:50], "MISMATCH", m, "", "", "", "", "")
    return t


def _human_map(doc: dict[str, Any], inv: str) -> Any:
    t = Table(
        title=f"execution map · window {_us(doc.get('window_ns'))} us · union coverage "
        f"{100 * doc.get('union_coverage', 0):.1f}% · idle {_us(doc.get('idle_total_ns'))} us in {doc.get('idle_gaps')} gaps",
        title_justify="left",
    )
    for c in ("lane", "intervals", "busy us", "coverage %"):
        t.add_column(c)
    for la in doc.get("lanes", []):
        t.add_row(la["lane"], str(la["intervals"]), _us(la["busy_ns"]), f"{100 * la['coverage']:.1f}")
    lines = [
        f"removable '{r['label']}': at most {_us(r['removable_ns'])} us ({100 * r['removable_fraction']:.2f}% of the window); "
        f"{_us(r['overlapped_by_other_ns'])} us of it overlaps other work"
        for r in doc.get("removable", [])
    ]
    if lines:
        t.caption = "\n".join(lines)
    return t


# ---------------------------------------------------------------------------------------------
# Commands


_policy = click.option(
    "--policy", type=click.Path(path_type=Path), default=None, help="Ops policy YAML (default $CKO_POLICY)."
)
_target = click.option(
    "--target", "target", default=None, help="Target id whose frozen identity the facts are bound to."
)
_tool_version = click.option(
    "--tool-version", default=None, help="Version of the tool that wrote the report."
)
_memory = click.option(
    "--memory",
    default="4g",
    show_default=True,
    help="Memory limit of the parse's container (e.g. 512m, 8g); a report that needs more stops it, exit 1.",
)


def _collect_outcome(where: Where, request: Path | None, target: str | None, tool: str) -> Outcome:
    from ..fleet import open_executor
    from ..workflow.collect import CollectOptions, collect_ncu, collect_nsys, collect_torch, load

    if request is None:
        raise bad_request("--collect needs --request", field="request")
    creq, _ = load(request)
    if target:
        creq = creq.model_copy(update={"target": target})
    collector, human = {
        "ncu": (collect_ncu, _human_ncu),
        "nsys": (collect_nsys, _human_nsys),
        "torch": (collect_torch, _human_torch),
    }[tool]
    with open_executor(where.fleet, where.gpu_model) as executor:
        opts = CollectOptions(
            policy_path=str(where.policy) if where.policy else None,
            parse_memory=where.memory,
            executor=executor,
        )
        doc, code = collector(Store(where.store), creq, say, opts)
    facts = doc.get("facts") or {}
    return Outcome(
        doc=doc,
        human=human(facts, doc["collection"]["id"]) if code == 0 and facts else doc,
        exit_code=code,
    )


@click.group(name="profile")
def profile() -> None:
    """Facts from a profiler report (Nsight Compute CSV, Nsight Systems SQLite, PyTorch trace).

    The report is parsed inside the sandbox; versions, columns and units the parser does not
    know are refused with a reason (exit 1), never guessed.
    """


@profile.command(name="ncu")
@click.option(
    "--report",
    required=False,
    type=click.Path(path_type=Path),
    help="ncu --csv output (--page raw or details).",
)
@click.option(
    "--collect", is_flag=True, help="Run the Target's driver under ncu in the sandbox (needs --request)."
)
@click.option(
    "--request",
    "request",
    type=click.Path(path_type=Path),
    help="With --collect: {target, subject (original or a variant id), case, reps, ncu_args}.",
)
@_tool_version
@click.option(
    "--version-file",
    type=click.Path(path_type=Path),
    default=None,
    help="`ncu --version` output captured at collection (default: REPORT.version if it exists).",
)
@_target
@_policy
@_memory
@fleet_options
@common
@handled
def profile_ncu(
    report: Path | None,
    collect: bool,
    request: Path | None,
    tool_version: str | None,
    version_file: Path | None,
    target: str | None,
    policy: Path | None,
    memory: str,
    fleet: str | None,
    gpu_model: str | None,
    store: Path,
    as_json: bool,
) -> Outcome:
    """Nsight Compute CSV: per launch name, grid, block, duration, throughputs, occupancy, registers, memory.

    With --collect, the Target's driver runs under `ncu --clock-control none` in the cuda image
    (as the non-root container user: no capability is added; refused where the host keeps counters to admins) and the report it writes is parsed."""
    where = Where(store, policy, memory, fleet, gpu_model)
    if collect:
        return _collect_outcome(where, request, target, "ncu")
    if report is None:
        raise bad_request("--report is required (or --collect --request F)", field="report")
    rep = _file(report, "report")
    inputs = {REPORT_NAMES["ncu"]: rep}
    args = ["--report", f"/cko/in/{REPORT_NAMES['ncu']}"]
    sidecar = Path(str(rep) + ".version")
    vf = version_file or (sidecar if sidecar.is_file() else None)
    if vf is not None:
        inputs["ncu-version.txt"] = _file(vf, "version_file")
        args += ["--version-file", "/cko/in/ncu-version.txt"]
    if tool_version:
        args += ["--tool-version", tool_version]
    args += _binding(Store(store), target)
    result = _run(where, "profile-ncu", args, inputs, "cpu", "profile ncu")
    return _finish(result, "profile-ncu", _human_ncu)


@profile.command(name="nsys")
@click.option(
    "--report", required=False, type=click.Path(path_type=Path), help="nsys export --type sqlite output."
)
@click.option(
    "--collect",
    is_flag=True,
    help="Run a subject's worker under nsys in the sandbox (needs --request); refused, code "
    "nsys_unavailable, where the Target's image has no nsys.",
)
@click.option(
    "--request",
    "request",
    type=click.Path(path_type=Path),
    help="With --collect: {target, subject (original or a variant id), case, reps}.",
)
@_tool_version
@_target
@_policy
@_memory
@fleet_options
@common
@handled
def profile_nsys(
    report: Path | None,
    collect: bool,
    request: Path | None,
    tool_version: str | None,
    target: str | None,
    policy: Path | None,
    memory: str,
    fleet: str | None,
    gpu_model: str | None,
    store: Path,
    as_json: bool,
) -> Outcome:
    """Nsight Systems SQLite export: kernels, memcpy/memset, CUDA API calls, NVTX ranges."""
    where = Where(store, policy, memory, fleet, gpu_model)
    if collect:
        return _collect_outcome(where, request, target, "nsys")
    if report is None:
        raise bad_request("--report is required (or --collect --request F)", field="report")
    rep = _file(report, "report")
    args = ["--report", f"/cko/in/{REPORT_NAMES['nsys']}"]
    if tool_version:
        args += ["--tool-version", tool_version]
    args += _binding(Store(store), target)
    result = _run(where, "profile-nsys", args, {REPORT_NAMES["nsys"]: rep}, "cpu", "profile nsys")
    return _finish(result, "profile-nsys", _human_nsys)


@profile.command(name="torch")
@click.option(
    "--report",
    required=False,
    type=click.Path(path_type=Path),
    help="PyTorch Profiler export_chrome_trace output.",
)
@click.option(
    "--collect",
    is_flag=True,
    help="Profile one block of a subject of the Target in its worker container (needs --request).",
)
@click.option(
    "--request",
    "request",
    type=click.Path(path_type=Path),
    help="With --collect: {target, subject (original or a variant id), case, reps}.",
)
@_tool_version
@_target
@_policy
@_memory
@fleet_options
@common
@handled
def profile_torch(
    report: Path | None,
    collect: bool,
    request: Path | None,
    tool_version: str | None,
    target: str | None,
    policy: Path | None,
    memory: str,
    fleet: str | None,
    gpu_model: str | None,
    store: Path,
    as_json: bool,
) -> Outcome:
    """PyTorch Profiler trace: CPU ops, CUDA calls, kernels, copies, launch-to-kernel correlation.

    With --collect, the subject runs in its own worker container exactly as in a measurement and its
    first timed block (after one warm-up) runs under torch.profiler; the Chrome trace is kept as an
    object of the collection, bound to the Target, the subject's snapshot and the environment, and
    parsed here. Diagnostic evidence: the trace is written by the subject's own process."""
    where = Where(store, policy, memory, fleet, gpu_model)
    if collect:
        return _collect_outcome(where, request, target, "torch")
    if report is None:
        raise bad_request("--report is required (or --collect --request F)", field="report")
    rep = _file(report, "report")
    args = ["--report", f"/cko/in/{REPORT_NAMES['torch']}"]
    if tool_version:
        args += ["--tool-version", tool_version]
    args += _binding(Store(store), target)
    result = _run(where, "profile-torch", args, {REPORT_NAMES["torch"]: rep}, "cpu", "profile torch")
    return _finish(result, "profile-torch", _human_torch)


@click.command(name="sass")
@click.option(
    "--sass", "sass_file", type=click.Path(path_type=Path), default=None, help="cuobjdump --dump-sass output."
)
@click.option("--ptxas", "ptxas_file", type=click.Path(path_type=Path), default=None, help="ptxas -v output.")
@click.option(
    "--resource",
    "resource_file",
    type=click.Path(path_type=Path),
    default=None,
    help="cuobjdump --dump-resource-usage output.",
)
@click.option(
    "--binary",
    "binary",
    type=click.Path(path_type=Path),
    default=None,
    help="A CUDA binary: dumped with cuobjdump in the cuda image.",
)
@click.option("--ptx", "ptx_file", type=click.Path(path_type=Path), default=None, help="A PTX file.")
@click.option(
    "--triton",
    "triton_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="A Triton cache directory of one kernel (<hash>/) or of several: metadata, TTIR, TTGIR, LLIR, PTX.",
)
@click.option(
    "--subject",
    default=None,
    help='With --target: "original" or a variant id, whose snapshot the compiler output came from.',
)
@_tool_version
@_target
@_policy
@_memory
@fleet_options
@common
@handled
def sass(
    sass_file: Path | None,
    ptxas_file: Path | None,
    resource_file: Path | None,
    binary: Path | None,
    ptx_file: Path | None,
    triton_dir: Path | None,
    subject: str | None,
    tool_version: str | None,
    target: str | None,
    policy: Path | None,
    memory: str,
    fleet: str | None,
    gpu_model: str | None,
    store: Path,
    as_json: bool,
) -> Outcome:
    """Compiler evidence: registers, spills, stack, instruction mix, HGMMA/HMMA/LDL/STL/LDGSTS/TMA;
    from PTX (--ptx) or a Triton kernel's cache (--triton) the same per-kernel stage facts."""
    where = Where(store, policy, memory, fleet, gpu_model)
    bind = _binding(Store(store), target, subject)
    if ptx_file is not None or triton_dir is not None:
        given = [n for n, v in (("sass", sass_file), ("ptxas", ptxas_file), ("resource", resource_file),
                                ("binary", binary)) if v is not None]  # fmt: skip
        if given or (ptx_file is not None and triton_dir is not None):
            raise bad_request(
                "give one of --ptx, --triton or the SASS inputs", field="ptx" if ptx_file else "triton"
            )
        inputs, args = _ptx_inputs(ptx_file) if ptx_file is not None else _triton_inputs(triton_dir)
        result = _run(where, "sass", args + bind, inputs, "cpu", "sass")
        return _finish(result, "sass", _human_stages)
    if binary is not None and (sass_file is not None or resource_file is not None):
        raise bad_request("give --binary, or --sass/--resource, not both", field="binary")
    if binary is None and sass_file is None and ptxas_file is None and resource_file is None:
        raise bad_request("give --sass F [--ptxas F] or --binary F", field="sass")
    inputs = {}
    args = []
    for flag, path, name in (
        ("--sass", sass_file, "sass.txt"),
        ("--ptxas", ptxas_file, "ptxas.txt"),
        ("--resource", resource_file, "resource_usage.txt"),
        ("--binary", binary, "binary"),
    ):
        if path is not None:
            inputs[name] = _file(path, flag.lstrip("-"))
            args += [flag, f"/cko/in/{name}"]
    if tool_version:
        args += ["--tool-version", tool_version]
    args += bind
    image = "cuda" if binary is not None else "cpu"
    result = _run(where, "sass", args, inputs, image, "sass")
    return _finish(result, "sass", _human_sass)


def _ptx_inputs(path: Path) -> tuple[dict[str, Path], list[str]]:
    return {"kernel.ptx": _file(path, "ptx")}, ["--ptx", "/cko/in/kernel.ptx"]


def _triton_inputs(root: Path | None) -> tuple[dict[str, Path], list[str]]:
    """Each kernel's files as inputs `k<i>-<file>`, one --triton-kernel group per kernel. The
    listing refuses links and special files here; the bytes are read by the sandbox's copy."""
    from cko_perf.operations.evidence.common import Refusal
    from cko_perf.operations.evidence.triton_stages import kernel_groups

    assert root is not None
    try:
        groups = kernel_groups(root)
    except Refusal as r:
        raise bad_request(f"triton: {r.message}", field="triton") from None
    inputs: dict[str, Path] = {}
    args: list[str] = []
    for i, files in enumerate(groups):
        args.append("--triton-kernel")
        for f in files:
            name = f"k{i}-{f.name}"
            inputs[name] = f
            args.append(f"/cko/in/{name}")
    return inputs, args


@click.command(name="execution-map")
@click.option(
    "--request", "request", required=True, type=click.Path(path_type=Path), help="Execution-map request JSON."
)
@_policy
@_memory
@fleet_options
@common
@handled
def execution_map(
    request: Path,
    policy: Path | None,
    memory: str,
    fleet: str | None,
    gpu_model: str | None,
    store: Path,
    as_json: bool,
) -> Outcome:
    """Coverage, overlap, idle gaps and the removable-time bound from intervals or a report.

    The request holds `intervals` ([{lane, name, start_ns, end_ns}]) or `source`
    ({kind: nsys|torch, report: PATH, include: [...]}), and optionally `window`, `exclude`,
    `remove` ([{label, names|contains|regex, lanes}]) and `max_gaps`.
    """
    where = Where(store, policy, memory, fleet, gpu_model)
    req_path = _file(request, "request")
    doc = load_json_file(req_path, "request")
    if not isinstance(doc, dict):
        raise bad_request("request: must be a JSON object", field="request")
    inputs = {"request.json": req_path}
    args = ["--request", "/cko/in/request.json"]
    src = doc.get("source")
    if isinstance(src, dict) and isinstance(src.get("report"), str):
        rp = Path(src["report"])
        if not rp.is_absolute():
            rp = (req_path.parent / rp).resolve()
        inputs["report"] = _file(rp, "source.report")
        args += ["--report", "/cko/in/report"]
    result = _run(where, "execution-map", args, inputs, "cpu", "execution map")
    return _finish(result, "execution-map", _human_map)


commands = [profile, sass, execution_map]
