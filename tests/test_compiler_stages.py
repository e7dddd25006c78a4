"""Compiler stages: PTX and Triton's cache (TTIR/TTGIR/LLIR/PTX + metadata) on the real files Triton
3.6.0 wrote (tests/fixtures/triton_stages/README.md), the hostile variants derived from them at
test time, the in-container operation, and (marked docker) `cko sass --ptx|--triton` in the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from cko_perf.operations.evidence.common import Binding, Refusal
from cko_perf.operations.evidence.compiler_evidence import parse_triton_evidence
from cko_perf.operations.evidence.mlir_stage import parse_mlir_stage
from cko_perf.operations.evidence.ptx import MAX_BYTES, parse_ptx
from cko_perf.operations.evidence.sass import parse_compiler_evidence
from cko_perf.operations.evidence.triton_llir import parse_llir
from cko_perf.operations.evidence.triton_stages import kernel_groups, parse_triton_kernel
from cko_perf.operations.ops import sass as sass_op
from tests.conftest import ROOT, run_cko

CACHE = ROOT / "tests" / "fixtures" / "triton_stages" / "cache"
SASS = ROOT / "tests" / "fixtures" / "sass"


def kdir(label: str) -> Path:
    (d,) = (CACHE / label).iterdir()
    return d


def kfile(label: str, ext: str) -> Path:
    (f,) = [p for p in kdir(label).iterdir() if p.suffix == f".{ext}" and not p.name.startswith("__grp__")]
    return f


def refused(fn, *args, **kw) -> Refusal:
    with pytest.raises(Refusal) as info:
        fn(*args, **kw)
    assert info.value.code and info.value.message
    return info.value


def derive(tmp: Path, src: Path, edit, name: str | None = None) -> Path:
    """A copy of a real file with one change made here (the fixture itself is never edited)."""
    out = tmp / (name or src.name)
    out.write_text(edit(src.read_text()))
    return out


def copy_kernel(tmp: Path, label: str) -> Path:
    dest = tmp / label
    shutil.copytree(kdir(label), dest)
    return dest


# ---------------------------------------------------------------------------------------------
# PTX


def test_ptx_of_the_triton_matmul_shows_wgmma_and_cp_async():
    t0 = time.perf_counter()
    m = parse_ptx(kfile("matmul", "ptx"))
    elapsed = time.perf_counter() - t0
    assert (m.version, m.target, m.address_size, m.cuda_release) == ("8.7", "sm_90a", 64, "12.8")
    assert m.shared_dynamic == ["global_smem"] and m.shared_static_bytes == 0
    (f,) = m.functions
    assert f.name == "matmul_kernel" and f.kind == "entry" and f.visible
    assert f.directives == {"reqntid": [128]}
    assert f.registers["pred"] > 0 and f.registers_total == sum(f.registers.values())
    assert f.tensor_core == {"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16": 8}
    assert f.async_copy["cp.async.cg.shared.global"] == 48 and f.async_copy["cp.async.commit_group"] == 6
    assert f.tma == {} and f.bulk_copy == {}
    assert {"wgmma", "cp.async", "ldmatrix"} <= set(f.flags) and "mma" not in f.flags
    assert f.instructions == sum(f.opcodes.values()) == sum(f.families.values())
    assert f.stores["global"] == {"16": 16}  # st.global.v4.b32
    assert elapsed < 1.0, elapsed


def test_ptx_of_vector_add_and_softmax():
    add = parse_ptx(kfile("vector_add", "ptx")).functions[0]
    assert add.loads["global"] == {"16": 4} and add.stores["global"] == {"16": 2}
    assert add.tensor_core == {} and add.flags == []
    sm = parse_ptx(kfile("row_softmax", "ptx")).functions[0]
    assert sm.families["shfl"] > 0 and sm.families["ex2"] > 0
    assert sm.loads["global"] == {"4": 8} and "local_memory" not in sm.flags


def test_ptx_unknown_version_and_target_are_refused(tmp_path):
    src = kfile("vector_add", "ptx")
    v = derive(tmp_path, src, lambda t: t.replace(".version 8.7", ".version 9.9"), "v.ptx")
    r = refused(parse_ptx, v)
    assert r.code == "unknown_ptx_version" and r.field == "ptx.version"
    t = derive(tmp_path, src, lambda t: t.replace(".target sm_90a", ".target sm_95z"), "t.ptx")
    assert refused(parse_ptx, t).code == "unknown_ptx_target"
    old = derive(tmp_path, src, lambda t: t.replace(".version 8.7", ".version 7.8"), "o.ptx")
    assert refused(parse_ptx, old).code == "target_needs_newer_ptx"  # sm_90a arrived in PTX 8.0


def test_ptx_hostile_files_are_refused(tmp_path):
    src = kfile("matmul", "ptx")
    text = src.read_text()
    cut = tmp_path / "cut.ptx"
    cut.write_text(text[: len(text) // 3])
    assert refused(parse_ptx, cut).code == "truncated"
    huge = tmp_path / "huge.ptx"
    shutil.copy(src, huge)
    os.truncate(huge, MAX_BYTES + 1)  # sparse: refused by its size before a byte is read
    assert refused(parse_ptx, huge).code == "too_large"
    binary = tmp_path / "bin.ptx"
    binary.write_bytes(kfile("matmul", "cubin").read_bytes())
    assert refused(parse_ptx, binary).code in ("not_text", "not_ptx")
    assert refused(parse_ptx, kfile("matmul", "ttgir")).code == "not_ptx"
    assert refused(parse_ptx, tmp_path / "missing.ptx").code == "unreadable"


# ---------------------------------------------------------------------------------------------
# TTIR / TTGIR / LLIR


def test_ttgir_of_the_matmul_layouts_and_ops():
    g = parse_mlir_stage(kfile("matmul", "ttgir"), "ttgir")
    assert g.functions == ["matmul_kernel"]
    assert g.module_attributes["ttg.num-warps"] == "4" and g.module_attributes["ttg.target"] == "cuda:90"
    kinds = {la.alias: la for la in g.layouts}
    assert kinds["mma"].kind == "ttg.nvidia_mma" and kinds["mma"].params["instrShape"] == "[16, 128, 16]"
    assert kinds["blocked"].kind == "ttg.blocked" and kinds["shared"].kind == "ttg.nvmma_shared"
    assert g.mma_versions == ["3.0"]
    assert g.tensor_core["ttng.warp_group_dot"] == 1
    assert g.async_copy["ttg.async_copy_global_to_local"] == 6
    assert g.operations == sum(g.ops.values()) == sum(g.dialects.values())
    assert set(g.dialects) == {"tt", "arith", "ttg", "ttng", "scf"}


def test_ttir_has_tt_dot_and_no_gpu_dialects():
    t = parse_mlir_stage(kfile("matmul", "ttir"), "ttir")
    assert t.tensor_core == {"tt.dot": 1} and "ttg" not in t.dialects and t.layouts == []
    s = parse_mlir_stage(kfile("row_softmax", "ttir"), "ttir")
    assert s.ops["tt.reduce"] == 2 and s.ops["math.exp"] == 1


def test_unknown_dialect_is_refused_with_its_line(tmp_path):
    src = kfile("matmul", "ttgir")
    op = derive(tmp_path, src, lambda t: t.replace("ttng.warp_group_dot ", "xyzgpu.warp_group_dot ", 1))
    r = refused(parse_mlir_stage, op, "ttgir")
    assert r.code == "unknown_dialect" and r.field == "ttgir" and r.detail["dialect"] == "xyzgpu"
    lay = derive(tmp_path, src, lambda t: t.replace("#ttg.nvidia_mma<", "#amdgpu.mfma<", 1), "l.ttgir")
    assert refused(parse_mlir_stage, lay, "ttgir").detail["dialect"] == "amdgpu"
    # PTX handed in as TTGIR: its first opcode reads as a dialect cko does not know
    assert refused(parse_mlir_stage, kfile("matmul", "ptx"), "ttgir").code == "unknown_dialect"
    assert refused(parse_mlir_stage, kfile("matmul", "json"), "ttgir").code == "not_mlir"


def test_llir_intrinsics_and_inline_asm(tmp_path):
    ll = parse_llir(kfile("matmul", "llir"))
    assert ll.functions_defined == ["matmul_kernel"] and ll.declarations > 0
    assert ll.intrinsics["llvm.nvvm.wgmma.fence.sync.aligned"] == 1
    assert ll.inline_asm["wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"] == 8
    amd = derive(
        tmp_path,
        kfile("vector_add", "llir"),
        lambda t: t.replace("llvm.nvvm.read.ptx.sreg.tid.x", "llvm.amdgcn.workitem.id.x"),
    )
    assert refused(parse_llir, amd).code == "foreign_intrinsic"


# ---------------------------------------------------------------------------------------------
# Triton kernels: metadata, stages, the directory


def test_triton_kernel_metadata_and_cross_checks():
    k = parse_triton_kernel([p for p in kdir("matmul").iterdir() if not p.name.startswith("__grp__")])
    md = k.metadata
    assert (md.name, md.num_warps, md.num_stages, md.num_ctas, md.arch) == ("matmul_kernel", 4, 3, 1, 90)
    assert md.triton_version == "3.6.0" and md.backend == "cuda" and len(md.hash or "") == 64
    assert md.shared == 3 * (128 * 64 + 64 * 128) * 2  # three stages of bf16 A and B tiles
    assert set(k.ir) == {"source", "ttir", "ttgir"} and k.cubin is not None and k.mismatches == []
    assert set(k.files) == {"json", "source", "ttir", "ttgir", "llir", "ptx", "cubin"}


def test_triton_directory_gives_one_kernel_per_cache_dir():
    t0 = time.perf_counter()
    f = parse_triton_evidence(kernel_groups(CACHE), bound_to=Binding(compute_capability="9.0"))
    elapsed = time.perf_counter() - t0
    assert f.kind == "triton" and f.tool_version == "3.6.0" and f.identity_mismatch == []
    by = {k.name: k for k in f.kernels}
    assert set(by) == {"add_kernel", "softmax_kernel", "matmul_kernel"}
    mm = by["matmul_kernel"].stages
    assert list(mm) == ["metadata", "source", "ttir", "ttgir", "llir", "ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in mm["ptx"].tensor_core
    assert mm["ttgir"].flags == ["mma_v3.0"] and mm["ttir"].arch is None and mm["ptx"].arch == "sm_90a"
    assert mm["metadata"].shared_bytes == 98304
    assert by["add_kernel"].stages["ptx"].tensor_core == {}
    g = parse_triton_evidence(kernel_groups(CACHE / "vector_add"), bound_to=Binding(compute_capability="8.0"))
    assert [m.field for m in g.identity_mismatch] == ["compute_capability"]
    assert elapsed < 2.0, elapsed


def test_triton_host_modules_in_the_cache_are_known_and_not_a_kernel(tmp_path):
    """Triton 3.6 on the H200 caches its compiled C launcher and driver glue in hash directories of
    their own beside the kernels' (tests/gpu/README.md): recognised, not parsed, not a refusal; an
    unknown shared object beside a kernel still is."""
    copy_kernel(tmp_path / "cache", "vector_add")
    for name, h in (
        ("__triton_launcher.cpython-312-x86_64-linux-gnu.so", "L"),
        ("cuda_utils.cpython-312-x86_64-linux-gnu.so", "U"),
    ):
        (tmp_path / "cache" / h).mkdir()
        (tmp_path / "cache" / h / name).write_bytes(b"\x7fELF")
    facts = parse_triton_evidence(kernel_groups(tmp_path / "cache"))
    assert [k.name for k in facts.triton.kernels] == ["add_kernel"]
    (tmp_path / "cache" / "L" / "libevil.so").write_bytes(b"\x7fELF")
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "cache")).code == "unknown_stage"


def test_triton_hostile_caches_are_refused(tmp_path):
    d = copy_kernel(tmp_path / "a", "vector_add")
    (d / "add_kernel.hsaco").write_bytes(b"\x7fELF")
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "a")).code == "unknown_stage"
    d = copy_kernel(tmp_path / "b", "vector_add")
    os.symlink("/etc/passwd", d / "add_kernel.ttir.link")
    assert refused(kernel_groups, tmp_path / "b").code == "symlink"
    d = copy_kernel(tmp_path / "c", "vector_add")
    meta = json.loads((d / "add_kernel.json").read_text())
    (d / "add_kernel.json").write_text(json.dumps(meta | {"triton_version": "2.1.0"}))
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "c")).code == "unknown_triton_version"
    (d / "add_kernel.json").write_text(json.dumps(meta | {"target": {"backend": "hip", "arch": "gfx942"}}))
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "c")).code == "unknown_backend"
    (d / "add_kernel.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "num_warps"}))
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "c")).field == "metadata.num_warps"
    (d / "add_kernel.json").write_text((d / "add_kernel.json").read_text()[:40])
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "c")).code == "not_json"
    d = copy_kernel(tmp_path / "e", "vector_add")
    (d / "add_kernel.json").unlink()
    assert refused(parse_triton_evidence, kernel_groups(tmp_path / "e")).code == "no_metadata"
    (tmp_path / "empty").mkdir()
    assert refused(kernel_groups, tmp_path / "empty").code == "no_kernels"


def test_triton_stage_disagreement_is_a_fact(tmp_path):
    d = copy_kernel(tmp_path, "vector_add")
    ttgir = d / "add_kernel.ttgir"
    ttgir.write_text(ttgir.read_text().replace('"ttg.num-warps" = 4', '"ttg.num-warps" = 8'))
    (k,) = parse_triton_evidence(kernel_groups(d)).kernels
    assert k.mismatches == ["ttgir ttg.num-warps 8 is not metadata num_warps 4"]


# ---------------------------------------------------------------------------------------------
# One result model: sass fits it too


def test_sass_results_fill_the_same_kernel_stages():
    f = parse_compiler_evidence(sass=SASS / "triton_matmul_ptr.sass")
    (k,) = f.kernels
    assert k.name == "matmul_ptr" and list(k.stages) == ["sass"]
    s = k.stages["sass"]
    assert s.arch == "sm_90a" and s.tensor_core.get("HGMMA", 0) > 0 and s.async_copy["LDGSTS"] > 0
    g = parse_compiler_evidence(sass=SASS / "kernels.sass", ptxas=SASS / "kernels.ptxas.txt")
    spill = next(k for k in g.kernels if k.name == "_Z12spill_kernelPKfPfi")
    assert spill.stages["ptxas"].registers == 32 and (spill.stages["ptxas"].spill_bytes or 0) > 0
    assert f.kind == "sass" and f.ptx is None and f.triton is None


# ---------------------------------------------------------------------------------------------
# The in-container operation


def _result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_op_ptx_and_triton(tmp_path):
    assert sass_op.main(["--ptx", str(kfile("matmul", "ptx")), "--bind-target", "tgt-x", "--bind-subject",
                         "original", "--bind-snapshot", "ab" * 32, "--out", str(tmp_path / "p")]) == 0  # fmt: skip
    doc = _result(tmp_path / "p")
    assert doc["kind"] == "ptx" and doc["bound_to"]["snapshot_sha256"] == "ab" * 32
    assert doc["kernels"][0]["stages"]["ptx"]["virtual_registers"] > 0
    renamed = tmp_path / "in"
    renamed.mkdir()
    for f in kdir("row_softmax").iterdir():  # the CLI mounts files under other names: the stage is the suffix
        if not f.name.startswith("__grp__"):
            shutil.copy(f, renamed / f"k0-{f.name}")
    args = ["--triton-kernel", *map(str, sorted(renamed.iterdir())), "--out", str(tmp_path / "t")]
    assert sass_op.main(args) == 0
    assert _result(tmp_path / "t")["triton"]["kernels"][0]["name"] == "softmax_kernel"
    bad = ["--ptx", str(kfile("matmul", "ttir")), "--out", str(tmp_path / "b")]
    assert sass_op.main(bad) == 1 and _result(tmp_path / "b")["error"] == "not_ptx"
    both = [
        "--ptx",
        str(kfile("matmul", "ptx")),
        "--sass",
        str(SASS / "kernels.sass"),
        "--out",
        str(tmp_path / "c"),
    ]
    assert sass_op.main(both) == 1 and _result(tmp_path / "c")["field"] == "ptx"


# ---------------------------------------------------------------------------------------------
# Through the sandbox


@pytest.mark.docker
def test_cli_sass_ptx_and_triton_in_the_sandbox(tmp_path):
    store = tmp_path / "store"
    p = run_cko("sass", "--ptx", str(kfile("matmul", "ptx")), "--json", store=store, timeout=600)
    assert p.code == 0, p.stdout + p.stderr
    facts = p.json["facts"]
    assert facts["kind"] == "ptx" and facts["ptx"]["functions"][0]["tensor_core"]
    t = run_cko("sass", "--triton", str(CACHE), "--json", store=store, timeout=600)
    assert t.code == 0, t.stdout + t.stderr
    names = sorted(k["name"] for k in t.json["facts"]["kernels"])
    assert names == ["add_kernel", "matmul_kernel", "softmax_kernel"]
    assert t.json["invocation_id"].startswith("inv-")
    runs = len(list((store / "invocations").iterdir()))
    bad = tmp_path / "bad"
    shutil.copytree(kdir("vector_add"), bad)
    ttgir = bad / "add_kernel.ttgir"
    ttgir.write_text(ttgir.read_text().replace("tt.load", "zz.load"))
    r = run_cko("sass", "--triton", str(bad), "--json", store=store, timeout=600)
    assert r.code == 1 and r.json["error"] == "unknown_dialect" and r.json["field"] == "ttgir"
    assert "facts" not in r.json and len(list((store / "invocations").iterdir())) == runs + 1
    link = tmp_path / "link"
    shutil.copytree(kdir("vector_add"), link)
    os.symlink("/etc/hostname", link / "add_kernel.extra")
    s = run_cko("sass", "--triton", str(link), "--json", store=store, timeout=600)
    assert s.code == 2 and s.json["field"] == "triton" and "symbolic link" in s.json["message"]
    u = run_cko("sass", "--ptx", str(kfile("matmul", "ptx")), "--subject", "original", "--json", store=store)
    assert u.code == 2 and u.json["field"] == "subject"
    # refused before anything ran: no invocation recorded
    assert len(list((store / "invocations").iterdir())) == runs + 1
