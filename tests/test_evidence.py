"""Profiler and compiler evidence: the parsers on real reports made on the lent H200
(tests/fixtures/*/README.md), hostile input, the in-container operation mains, and (marked
docker) the `cko profile|sass` commands through the sandbox.

Every hostile input must end in a refusal with a code (and a field where there is one) or, for
ncu's ERR_NVGPUCTRPERM, in facts that say `counters_not_permitted`: never a crash, never a zero
standing in for a value the report does not have.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from trace_outcomes import outcome, python_fast, reference

from cko_perf.operations.evidence import torch_trace
from cko_perf.operations.evidence.common import Binding, Refusal
from cko_perf.operations.evidence.ncu import (
    MODELED,
    UNITS_2025,
    normalise_unit,
    parse_ncu_csv,
    resolve_version,
)
from cko_perf.operations.evidence.nsys import parse_nsys_sqlite
from cko_perf.operations.evidence.sass import (
    parse_compiler_evidence,
    parse_ptxas,
    parse_resource_usage,
    parse_sass,
)
from cko_perf.operations.evidence.torch_trace import parse_torch_trace
from cko_perf.operations.ops import profile_ncu, profile_nsys, profile_torch
from cko_perf.operations.ops import sass as sass_op

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
NCU = FIX / "ncu"
VERSION_TEXT = (NCU / "ncu_version.txt").read_text()
NSYS_DB = FIX / "nsys" / "torch_like_export.sqlite"
TRACE = FIX / "torch" / "torch_trace.json"
SASS = FIX / "sass"
H200 = Binding(target_id="tgt-20261202T000000-abcdef", gpu_name="NVIDIA H200", compute_capability="9.0")


def ncu(name: str, **kw):
    kw.setdefault("version_text", VERSION_TEXT)
    return parse_ncu_csv(NCU / name, **kw)


def refused(fn, *args, **kw) -> Refusal:
    with pytest.raises(Refusal) as info:
        fn(*args, **kw)
    r = info.value
    assert r.code and r.message
    return r


# ---------------------------------------------------------------------------------------------
# Nsight Compute: real reports


def test_ncu_raw_page_facts_per_launch():
    f = ncu("kernels_raw.csv")
    assert f.page == "raw" and f.tool == "ncu" and f.tool_version == "2025.3.1.0"
    assert f.tool_version_source == "version_file" and f.dialect == "ncu-csv-2025.3"
    names = [la.name.split("(")[0] for la in f.launches]
    assert names == [
        "copy_coalesced",
        "copy_coalesced",
        "copy_strided",
        "spill_kernel",
        "wmma_gemm",
        "cp_async_scale",
    ]
    first = f.launches[0]
    assert first.grid == [16384, 1, 1] and first.block == [256, 1, 1]
    assert first.device == 0 and first.compute_capability == "9.0" and first.device_name == "NVIDIA H200"
    assert first.name_form == "demangled" and first.mangled_name is None
    assert first.stream == 7 and first.process_name == "kernels"
    for la in f.launches:
        assert la.duration_ns and la.duration_ns > 1000
        assert 0 < la.sm_throughput_pct <= 100 and 0 < la.dram_throughput_pct <= 100
        assert 0 < la.achieved_occupancy_pct <= 100
        assert la.registers_per_thread and la.registers_per_thread >= 16
        assert la.shared_memory_config_size_bytes and la.shared_memory_config_size_bytes >= 8192
        # The default set does not collect the memory-workload section: absent, not zero.
        assert "l1_hit_rate_pct" in la.absent and la.l1_hit_rate_pct is None
        assert la.unmodeled and "launch__grid_size" in la.unmodeled
    assert f.launches[5].static_shared_memory_per_block_bytes == 4096  # cp_async_scale's tile
    # The spilling kernel is the slowest, by far.
    assert max(f.launches, key=lambda la: la.duration_ns).name.startswith("spill_kernel")
    assert f.kernels[0].name.startswith("spill_kernel") and f.kernels[0].launches == 1
    assert next(k for k in f.kernels if k.name.startswith("copy_coalesced")).launches == 2
    assert f.report_identity.gpu_name == "NVIDIA H200" and f.report_identity.compute_capability == "9.0"
    assert f.units["gpu__time_duration.sum"] == "ns"


def test_ncu_preamble_lines_are_messages_not_rows():
    f = ncu("kernels_raw.csv")
    assert any(m.startswith("==PROF== Connected to process") for m in f.tool_messages)
    assert any(m.startswith("==WARNING==") for m in f.tool_messages)
    assert f.program_output_lines == 1  # "cp_async_scale check: ok; ..."
    assert f.limitation is None


def test_ncu_details_page_full_set():
    f = ncu("kernels_details_full.csv")
    assert f.page == "details" and len(f.launches) == 6
    assert f.rule_rows_omitted > 0  # ncu's guidance rows are advice, dropped
    for la in f.launches:
        assert la.absent == [] and la.not_available == []
        assert la.l2_hit_rate_pct is not None and 0 <= la.l2_hit_rate_pct <= 100
        assert la.sm_frequency_hz and 1e9 < la.sm_frequency_hz < 2.5e9
        assert la.unmodeled and "Memory Workload Analysis/Mem Busy" in la.unmodeled
    assert f.modeled_sources["duration_ns"] == "GPU Speed Of Light Throughput/Duration"
    assert not any("Rule" in k for k in f.units)
    # The details page names no device: only its compute capability can be checked.
    assert f.report_identity.gpu_name is None and f.report_identity.compute_capability == "9.0"


def test_ncu_raw_and_details_of_one_report_agree():
    raw = ncu("kernels_raw_full.csv")
    det = ncu("kernels_details_full_base_units.csv")
    assert [la.id for la in raw.launches] == [la.id for la in det.launches]
    for a, b in zip(raw.launches, det.launches, strict=True):
        assert a.name == b.name and a.grid == b.grid and a.block == b.block
        for field in MODELED:
            va, vb = getattr(a, field), getattr(b, field)
            assert va is not None and vb is not None, field
            # The details page rounds to 2 decimals (or 3-4 significant digits).
            assert math.isclose(va, vb, rel_tol=5e-3, abs_tol=0.01), (field, va, vb)


def test_ncu_auto_units_equal_base_units_for_every_metric():
    """The unit factors, calibrated: one report printed with auto-scaled and with base units."""
    auto, base = ncu("kernels_raw_full.csv"), ncu("kernels_raw_full_base_units.csv")
    assert set(auto.units.values()) == set(base.units.values())
    assert "Kbyte" not in json.dumps(auto.units) and "Ghz" not in json.dumps(auto.units)
    compared = 0
    for a, b in zip(auto.launches, base.launches, strict=True):
        assert a.unmodeled is not None and b.unmodeled is not None
        for key, va in a.unmodeled.items():
            vb = b.unmodeled[key]
            if isinstance(va, int | float) and isinstance(vb, int | float):
                compared += 1
                assert math.isclose(va, vb, rel_tol=1e-3, abs_tol=0.01), (key, va, vb, auto.units[key])
            else:
                assert va == vb, key
    assert compared > 10000


def test_ncu_unit_normalisation():
    assert normalise_unit(UNITS_2025, "ms") == (1e6, "ns")
    assert normalise_unit(UNITS_2025, "Gbyte") == (1e9, "byte")
    assert normalise_unit(UNITS_2025, "Tbyte/s") == (1e12, "byte/s")
    assert normalise_unit(UNITS_2025, "sector/ns") == (1e9, "sector/s")
    assert normalise_unit(UNITS_2025, "Ghz") == (1e9, "hz")
    assert normalise_unit(UNITS_2025, "%") == (1.0, "%")
    assert normalise_unit(UNITS_2025, "Kbyte/block") == (1e3, "byte/block")
    assert normalise_unit(UNITS_2025, "parsec") is None
    assert normalise_unit(UNITS_2025, "byte//s") is None


def test_ncu_mangled_names():
    m = ncu("kernels_raw_full_mangled.csv")
    d = ncu("kernels_raw_full.csv")
    assert [la.mangled_name for la in m.launches][:2] == ["_Z14copy_coalescedPK6float4PS_i"] * 2
    assert all(la.name_form == "mangled" and la.demangled_name is None for la in m.launches)
    assert [la.duration_ns for la in m.launches] == [la.duration_ns for la in d.launches]


def test_ncu_library_kernels_from_pytorch():
    f = ncu("torch_raw_full.csv")
    gemm = f.launches[0]
    assert gemm.name.startswith("nvjet_sm90") and gemm.grid == [2, 64, 1] and gemm.block == [384, 1, 1]
    assert gemm.registers_per_thread == 168 and gemm.dynamic_shared_memory_per_block_bytes > 200_000
    det = ncu("torch_details_full.csv")
    assert [la.name for la in det.launches] == [la.name for la in f.launches]
    assert det.launches[0].duration_ns == pytest.approx(gemm.duration_ns, rel=5e-3)


def test_ncu_unmodeled_launches_are_capped_and_counted():
    f = ncu("kernels_raw_full.csv", max_unmodeled_launches=2)
    assert f.unmodeled_launches_kept == 2 and f.unmodeled_launches_omitted == 4
    assert f.launches[1].unmodeled is not None and f.launches[2].unmodeled is None
    assert f.launches[5].duration_ns is not None  # the named facts of every launch stay


def test_ncu_identity_binding():
    ok = ncu("kernels_raw.csv", bound_to=H200)
    assert ok.bound_to == H200 and ok.identity_mismatch == []
    other = ncu(
        "kernels_raw.csv", bound_to=Binding(gpu_name="NVIDIA H100 80GB HBM3", compute_capability="sm_90")
    )
    assert [(m.field, m.report) for m in other.identity_mismatch] == [("gpu_name", "NVIDIA H200")]
    ampere = ncu(
        "kernels_details_full.csv", bound_to=Binding(compute_capability="8.0", gpu_name="NVIDIA A100")
    )
    assert [m.field for m in ampere.identity_mismatch] == ["compute_capability"]


# ---------------------------------------------------------------------------------------------
# Nsight Compute: versions and hostile input


def test_ncu_version_is_required_and_checked():
    r = refused(parse_ncu_csv, NCU / "kernels_raw.csv")
    assert r.code == "unknown_tool_version" and r.field == "tool_version"
    assert (
        refused(parse_ncu_csv, NCU / "kernels_raw.csv", tool_version="2023.1.0").code
        == "unknown_tool_version"
    )
    assert refused(parse_ncu_csv, NCU / "kernels_raw.csv", tool_version="latest").code == "bad_tool_version"
    assert refused(resolve_version, None, "ncu, some build").code == "bad_version_file"
    conflict = refused(resolve_version, "2025.3.0", VERSION_TEXT)
    assert conflict.code == "version_conflict"
    assert resolve_version("2025.3.1", VERSION_TEXT)[1] == "argument"
    f = parse_ncu_csv(NCU / "kernels_raw.csv", tool_version="2025.3.1")
    assert f.tool_version == "2025.3.1" and f.tool_version_source == "argument"


def _csv_lines(name: str) -> list[str]:
    return (NCU / name).read_text().splitlines(keepends=True)


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_ncu_truncated_row(tmp_path):
    text = (NCU / "kernels_raw.csv").read_text()
    cut = _write(tmp_path, "cut.csv", text[: len(text) - 3000])
    r = refused(parse_ncu_csv, cut, version_text=VERSION_TEXT)
    assert r.code == "truncated" and "line" in r.message


def test_ncu_truncated_inside_quotes(tmp_path):
    text = (NCU / "kernels_details_full.csv").read_text()
    pos = text.rindex('"Memory Workload Analysis","L2 Hit Rate"') + 10
    r = refused(parse_ncu_csv, _write(tmp_path, "cut.csv", text[:pos]), version_text=VERSION_TEXT)
    assert r.code == "truncated"


def test_ncu_wrong_delimiter(tmp_path):
    lines = _csv_lines("kernels_raw.csv")
    semi = [line.replace('","', '";"') for line in lines]
    r = refused(parse_ncu_csv, _write(tmp_path, "semi.csv", "".join(semi)), version_text=VERSION_TEXT)
    assert r.code == "not_ncu_csv"
    tabs = [line.replace('","', "\t").replace('"', "") for line in lines]
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "tab.csv", "".join(tabs)), version_text=VERSION_TEXT).code
        == "not_ncu_csv"
    )


def test_ncu_duplicate_header_column_and_repeated_header(tmp_path):
    lines = _csv_lines("kernels_raw.csv")
    h = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    dup = list(lines)
    dup[h] = dup[h].replace('"Stream"', '"Context"')
    r = refused(parse_ncu_csv, _write(tmp_path, "dup.csv", "".join(dup)), version_text=VERSION_TEXT)
    assert r.code == "duplicate_column" and r.field == "Context"
    again = lines + [lines[h]] + lines[h + 2 :]
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "again.csv", "".join(again)), version_text=VERSION_TEXT).code
        == "duplicate_header"
    )


def test_ncu_missing_key_column(tmp_path):
    import csv
    import io

    rows = list(csv.reader(io.StringIO("".join(_csv_lines("kernels_raw_full.csv")))))
    k = rows[0].index("Kernel Name")
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        w.writerow(row[:k] + row[k + 1 :])
    r = refused(parse_ncu_csv, _write(tmp_path, "nokernel.csv", buf.getvalue()), version_text=VERSION_TEXT)
    assert r.code == "missing_column" and r.field == "Kernel Name"


def test_ncu_unknown_unit(tmp_path):
    text = (NCU / "kernels_raw_full.csv").read_text()
    assert '"Gbyte"' in text
    r = refused(
        parse_ncu_csv,
        _write(tmp_path, "unit.csv", text.replace('"Gbyte"', '"Gibibyte"', 1)),
        version_text=VERSION_TEXT,
    )
    assert r.code == "unknown_unit" and "Gibibyte" in r.message and r.field
    det = (
        (NCU / "kernels_details_full.csv").read_text().replace('"Duration","ns"', '"Duration","fortnight"', 1)
    )
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "unit2.csv", det), version_text=VERSION_TEXT).code
        == "unknown_unit"
    )


def test_ncu_modeled_metric_with_the_wrong_dimension(tmp_path):
    det = (NCU / "kernels_details_full.csv").read_text().replace('"Duration","ns"', '"Duration","cycle"', 1)
    r = refused(parse_ncu_csv, _write(tmp_path, "dim.csv", det), version_text=VERSION_TEXT)
    assert r.code == "unexpected_unit"


def test_ncu_garbage_empty_and_nul(tmp_path):
    rnd = random.Random(6)
    garbage = bytes(rnd.randrange(256) for _ in range(50000))
    assert refused(parse_ncu_csv, _write(tmp_path, "g.bin", garbage), version_text=VERSION_TEXT).code in (
        "not_text",
        "not_ncu_csv",
    )
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "e.csv", ""), version_text=VERSION_TEXT).code == "not_ncu_csv"
    )
    text = (NCU / "kernels_raw.csv").read_text()
    nul = text.replace('"copy_strided', '"copy\x00strided', 1)
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "nul.csv", nul), version_text=VERSION_TEXT).code == "not_text"
    )
    assert refused(parse_ncu_csv, tmp_path / "missing.csv", version_text=VERSION_TEXT).code == "unreadable"


def test_ncu_duplicate_and_interleaved_launches(tmp_path):
    lines = _csv_lines("kernels_raw.csv")
    twice = lines + [lines[-1]]
    assert (
        refused(parse_ncu_csv, _write(tmp_path, "twice.csv", "".join(twice)), version_text=VERSION_TEXT).code
        == "duplicate_launch"
    )
    det = _csv_lines("kernels_details_full.csv")
    first = next(line for line in det if line.startswith('"0",'))
    assert (
        refused(
            parse_ncu_csv, _write(tmp_path, "inter.csv", "".join(det) + first), version_text=VERSION_TEXT
        ).code
        == "duplicate_launch"
    )


def test_ncu_bad_value_in_a_named_fact(tmp_path):
    text = (NCU / "kernels_details_full.csv").read_text()
    i = text.index('"Registers Per Thread","register/thread","')
    j = text.index('"', i + len('"Registers Per Thread","register/thread","'))
    bad = text[: i + len('"Registers Per Thread","register/thread","')] + "many" + text[j:]
    r = refused(parse_ncu_csv, _write(tmp_path, "bad.csv", bad), version_text=VERSION_TEXT)
    assert r.code == "bad_value" and r.field == "registers_per_thread"


PERM_ERROR = (
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters "
    "on the target device 0. For instructions on enabling permissions and to get more information see "
    "https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
)


def test_ncu_counters_not_permitted_is_a_limitation_not_zeros(tmp_path):
    lines = _csv_lines("kernels_raw.csv")
    h = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    text = "".join(lines[:h]) + PERM_ERROR + "".join(lines[h:])
    f = parse_ncu_csv(_write(tmp_path, "perm.csv", text), version_text=VERSION_TEXT)
    assert f.limitation == "counters_not_permitted"
    for la in f.launches:
        assert la.limitation == "counters_not_permitted"
        for field, (kind, _r, _d) in MODELED.items():
            if kind == "counter":
                assert getattr(la, field) is None, field
        assert la.registers_per_thread is not None and la.grid  # launch configuration stays
    assert any("ERR_NVGPUCTRPERM" in m for m in f.tool_messages)
    # The message after the table (where ncu may print it) has the same effect.
    late = parse_ncu_csv(_write(tmp_path, "late.csv", "".join(lines) + PERM_ERROR), version_text=VERSION_TEXT)
    assert late.limitation == "counters_not_permitted" and all(la.duration_ns is None for la in late.launches)
    assert late.kernels[0].duration_ns_total is None


def test_ncu_counters_not_permitted_without_any_table(tmp_path):
    text = (
        "==PROF== Connected to process 12 (/w/app)\n" + PERM_ERROR + "==PROF== Disconnected from process 12\n"
    )
    f = parse_ncu_csv(_write(tmp_path, "perm_only.csv", text), version_text=VERSION_TEXT)
    assert f.limitation == "counters_not_permitted" and f.launches == [] and f.kernels == []


@pytest.mark.slow
@pytest.mark.parametrize("page", ["raw", "details"])
def test_ncu_200mb_report_streams_in_bounded_memory(tmp_path, page):
    """A 200 MB CSV made from the real fixture by repeating its launches under new IDs."""
    src = NCU / ("kernels_raw_full.csv" if page == "raw" else "kernels_details_full.csv")
    lines = src.read_text().splitlines(keepends=True)
    h = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    body_start = h + (2 if page == "raw" else 1)
    head, body = lines[:body_start], lines[body_start:]
    big = tmp_path / f"big_{page}.csv"
    per_copy = {line.split('","', 1)[0] for line in body}
    n_ids = len(per_copy)
    written = 0
    copies = 0
    with open(big, "w") as out:
        out.writelines(head)
        written = sum(len(x) for x in head)
        while written < 200 * 1024 * 1024:
            for line in body:
                rid, rest = line.split('","', 1)
                new = f'"{int(rid[1:]) + copies * n_ids}","{rest}'
                out.write(new)
                written += len(new)
            copies += 1
    script = textwrap.dedent(
        f"""
        import json, resource, sys
        from cko_perf.operations.evidence.ncu import parse_ncu_csv
        v = open({str(NCU / "ncu_version.txt")!r}).read()
        parse_ncu_csv({str(src)!r}, version_text=v)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        f = parse_ncu_csv(sys.argv[1], version_text=v)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"launches": len(f.launches), "kept": f.unmodeled_launches_kept,
                          "growth_kb": peak - base, "last": f.launches[-1].id}}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(big)], capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["launches"] == copies * n_ids and got["last"] == copies * n_ids - 1
    assert got["kept"] == 100
    # Keeping every row (or its dict) would take several times the file; the facts take far less.
    assert got["growth_kb"] < 100 * 1024, got  # measured: ~38 MB (raw), ~20 MB (details)


# ---------------------------------------------------------------------------------------------
# Nsight Systems


def test_nsys_export_facts():
    f = parse_nsys_sqlite(NSYS_DB)
    assert f.schema_version == "3.16.1" and f.dialect == "nsys-sqlite-3" and f.tool_version_source == "report"
    assert f.tables_absent == []
    assert f.counts["CUPTI_ACTIVITY_KIND_KERNEL"] == 21 and f.counts["CUPTI_ACTIVITY_KIND_MEMCPY"] == 9
    assert f.counts["CUPTI_ACTIVITY_KIND_MEMSET"] == 6 and len(f.nvtx) == 3
    gemm = next(k for k in f.kernels if k.name and k.name.startswith("nvjet"))
    assert (
        gemm.launched_by == "cuLaunchKernelEx"
        and gemm.grid == [2, 64, 1]
        and gemm.registers_per_thread == 168
    )
    assert all(k.launched_by for k in f.kernels)
    assert {s.name for s in f.memcpy_summary} == {"Host-to-Device", "Device-to-Host", "Device-to-Device"}
    assert f.kernel_summary[0].count == 3 and f.kernel_summary[0].name.startswith("nvjet")
    assert [n.text for n in f.nvtx] == ["step_0", "step_1", "step_2"] and all(
        n.type == "push_pop" for n in f.nvtx
    )
    assert f.api_summary[0].name == "cudaLaunchKernel"
    assert f.report_identity.gpu_name == "NVIDIA H200" and f.gpus[0].sm_count == 132
    assert f.unresolved_string_ids == 0 and f.omitted["kernels"] == 0


def test_nsys_matches_the_trace_it_was_built_from():
    n = parse_nsys_sqlite(NSYS_DB)
    t = parse_torch_trace(TRACE)
    assert sorted(k.duration_ns for k in n.kernels) == pytest.approx(
        sorted(g.duration_ns for g in t.gpu if g.category == "kernel"), abs=2
    )


def test_nsys_generator_reproduces_the_fixture(tmp_path):
    out = tmp_path / "again.sqlite"
    subprocess.run(
        [sys.executable, str(FIX / "nsys" / "make_nsys_fixture.py"), str(out)],
        check=True,
        capture_output=True,
    )
    a, b = parse_nsys_sqlite(NSYS_DB).model_dump(), parse_nsys_sqlite(out).model_dump()
    for d in (a, b):
        d.pop("report_sha256")
        d.pop("report_bytes")
    assert a == b


def test_nsys_read_only_and_untouched(tmp_path):
    copy = tmp_path / "r.sqlite"
    shutil.copy(NSYS_DB, copy)
    copy.chmod(0o444)
    before = copy.read_bytes()
    parse_nsys_sqlite(copy, max_events=5)
    assert copy.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite"]  # no journal, wal or shm


def test_nsys_event_lists_are_capped():
    f = parse_nsys_sqlite(NSYS_DB, max_events=4)
    assert len(f.kernels) == 4 and f.omitted["kernels"] == 17
    assert sum(s.count for s in f.kernel_summary) == 21  # summaries cover every row


def _sqlite(path: Path, sql: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(sql)
    conn.commit()
    conn.close()
    return path


def test_nsys_not_an_export(tmp_path):
    other = _sqlite(
        tmp_path / "other.sqlite",
        "CREATE TABLE users (id INTEGER, name TEXT); INSERT INTO users VALUES (1, 'a');",
    )
    r = refused(parse_nsys_sqlite, other)
    assert r.code == "not_nsys_export" and r.field == "StringIds" and "StringIds" in r.message
    half = _sqlite(tmp_path / "half.sqlite", "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);")
    assert refused(parse_nsys_sqlite, half).field == "META_DATA_EXPORT"
    view = _sqlite(
        tmp_path / "view.sqlite",
        "CREATE TABLE t (id INTEGER, value TEXT); CREATE VIEW StringIds AS SELECT * FROM t; "
        "CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);",
    )
    assert refused(parse_nsys_sqlite, view).code == "not_nsys_export"  # a view is not the export's table


def test_nsys_garbage_and_empty(tmp_path):
    rnd = random.Random(3)
    g = _write(tmp_path, "g.sqlite", bytes(rnd.randrange(256) for _ in range(40000)))
    assert refused(parse_nsys_sqlite, g).code == "not_sqlite"
    assert refused(parse_nsys_sqlite, _write(tmp_path, "e.sqlite", b"")).code == "not_nsys_export"
    assert (
        refused(parse_nsys_sqlite, _write(tmp_path, "t.sqlite", "SQLite format 3\x00 but not")).code
        == "not_sqlite"
    )


def _modified_export(tmp_path: Path, sql: str) -> Path:
    p = tmp_path / "mod.sqlite"
    shutil.copy(NSYS_DB, p)
    return _sqlite(p, sql)


def test_nsys_unknown_schema_version(tmp_path):
    p = _modified_export(
        tmp_path, "UPDATE META_DATA_EXPORT SET value = '4.0.1' WHERE name = 'EXPORT_SCHEMA_VERSION';"
    )
    r = refused(parse_nsys_sqlite, p)
    assert r.code == "unknown_schema_version" and r.field == "EXPORT_SCHEMA_VERSION"
    p2 = _modified_export(tmp_path, "DELETE FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION';")
    assert refused(parse_nsys_sqlite, p2).code == "unknown_schema_version"


def test_nsys_missing_column_and_absent_table(tmp_path):
    p = _modified_export(tmp_path, "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN shortName;")
    r = refused(parse_nsys_sqlite, p)
    assert r.code == "missing_column" and r.field == "CUPTI_ACTIVITY_KIND_KERNEL.shortName"
    q = tmp_path / "nomemset.sqlite"
    shutil.copy(NSYS_DB, q)
    _sqlite(q, "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET;")
    f = parse_nsys_sqlite(q)
    assert (
        f.tables_absent == ["CUPTI_ACTIVITY_KIND_MEMSET"] and f.memsets == [] and "memsets" not in f.omitted
    )


def test_nsys_version_conflict_and_identity():
    assert refused(parse_nsys_sqlite, NSYS_DB, tool_version="2023.4").code == "version_conflict"
    f = parse_nsys_sqlite(
        NSYS_DB, bound_to=Binding(gpu_name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    )
    assert {m.field for m in f.identity_mismatch} == {"gpu_name", "compute_capability"}


# ---------------------------------------------------------------------------------------------
# PyTorch Profiler traces


def test_torch_trace_facts():
    f = parse_torch_trace(TRACE)
    assert f.schema_version == 1 and f.cuda_runtime_version == "13.0" and f.cupti_version == 130001
    assert f.counts["kernel"] == 21 and f.counts["gpu_memcpy"] == 9 and f.counts["gpu_memset"] == 6
    assert f.gpu_events == 36 and f.gpu_events_correlated == 36
    d = f.devices[0]
    assert d.name == "NVIDIA H200" and d.compute_capability == "9.0" and d.sm_count == 132
    gemm = next(g for g in f.gpu if g.name.startswith("nvjet"))
    assert gemm.op == "aten::mm" and gemm.launched_by == "cuLaunchKernelEx"
    assert gemm.launch_delay_ns and gemm.launch_delay_ns > 0 and gemm.registers_per_thread == 168
    h2d = next(g for g in f.gpu if "HtoD" in g.name)
    assert (
        h2d.bytes == 16 * 1024 * 1024
        and h2d.launched_by == "cudaMemcpyAsync"
        and h2d.category == "gpu_memcpy"
    )
    assert [g.start_ns for g in f.gpu] == sorted(g.start_ns for g in f.gpu)
    assert f.kernel_summary[0].name.startswith("nvjet") and f.kernel_summary[0].count == 3
    assert f.tool_version is None and f.tool_version_source is None
    assert parse_torch_trace(TRACE, tool_version="2.11.0+cu130").tool_version_source == "argument"


def _trace(tmp_path: Path, mutate) -> Path:
    doc = json.loads(TRACE.read_text())
    mutate(doc)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    return p


def _first(doc, cat):
    return next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == cat)


def test_torch_trace_missing_and_bad_fields(tmp_path):
    def drop_dur(doc):
        del doc["traceEvents"][_first(doc, "kernel")]["dur"]

    r = refused(parse_torch_trace, _trace(tmp_path, drop_dur))
    assert r.code == "missing_field" and r.field.endswith(".dur")

    def str_ts(doc):
        doc["traceEvents"][_first(doc, "cuda_runtime")]["ts"] = "soon"

    assert refused(parse_torch_trace, _trace(tmp_path, str_ts)).field.endswith(".ts")

    def negative(doc):
        doc["traceEvents"][_first(doc, "gpu_memcpy")]["dur"] = -5

    assert refused(parse_torch_trace, _trace(tmp_path, negative)).code == "bad_value"

    def no_name(doc):
        del doc["traceEvents"][_first(doc, "cpu_op")]["name"]

    assert refused(parse_torch_trace, _trace(tmp_path, no_name)).field.endswith(".name")

    def not_object(doc):
        doc["traceEvents"].insert(3, [1, 2])

    assert refused(parse_torch_trace, _trace(tmp_path, not_object)).code == "bad_value"


def test_torch_trace_not_a_trace(tmp_path):
    assert refused(parse_torch_trace, _write(tmp_path, "a.json", "{not json")).code == "not_json"
    assert refused(parse_torch_trace, _write(tmp_path, "b.json", "[1, 2]")).code == "not_torch_trace"
    assert (
        refused(parse_torch_trace, _write(tmp_path, "c.json", '{"traceEvents": {}}')).code
        == "not_torch_trace"
    )
    r = refused(parse_torch_trace, _write(tmp_path, "d.json", '{"traceEvents": []}'))
    assert r.code == "not_torch_trace" and r.field == "schemaVersion"
    assert (
        refused(parse_torch_trace, _write(tmp_path, "e.json", '{"traceEvents": [], "schemaVersion": 9}')).code
        == "unknown_schema_version"
    )
    rnd = random.Random(9)
    assert (
        refused(
            parse_torch_trace, _write(tmp_path, "g.bin", bytes(rnd.randrange(256) for _ in range(5000)))
        ).code
        == "not_json"
    )


def test_torch_trace_unknown_categories_are_counted(tmp_path):
    def add(doc):
        doc["traceEvents"].append({"ph": "X", "cat": "xpu_kernel", "name": "k", "ts": 1.0, "dur": 1.0})

    f = parse_torch_trace(_trace(tmp_path, add))
    assert f.unmodeled_categories == {"xpu_kernel": 1}


def test_torch_trace_identity_and_caps():
    f = parse_torch_trace(
        TRACE, bound_to=Binding(compute_capability="8.6", gpu_name="NVIDIA H200"), max_events=5
    )
    assert [m.field for m in f.identity_mismatch] == ["compute_capability"]
    assert len(f.gpu) == 5 and f.gpu_omitted == 31


# The compiled scanner, the fast path (msgspec into typed structs) and the reference path (the
# whole document, every event checked) must give the same facts, or the same refusal, for the
# same bytes. tests/test_trace_native.py holds the scanner to this on more inputs.


def _events(cat):
    return lambda doc: [e for e in doc["traceEvents"] if e.get("cat") == cat]


def _set_all(cat, key, value):
    return lambda doc: [e.__setitem__(key, value) for e in _events(cat)(doc)]


def _set_args(cat, key, value):
    return lambda doc: [e["args"].__setitem__(key, value) for e in _events(cat)(doc)[:1]]


def _add(*events):
    return lambda doc: doc["traceEvents"].extend(events)


FAST_CASES = {
    "as_is": lambda doc: None,
    "int_times": lambda doc: [
        e.__setitem__(k, int(e[k])) for e in doc["traceEvents"] for k in ("ts", "dur") if k in e
    ],
    "equal_gpu_starts": lambda doc: [
        e.__setitem__("ts", 1.0) for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")
    ],
    "other_categories": _add(
        {"ph": "X", "cat": "xpu_kernel", "name": "k", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "cat": None, "name": "k", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "name": "no cat", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "cat": "Trace", "name": "t", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "cat": "python_function", "name": "f", "ts": 2.5, "dur": 0.5, "args": {"External id": 3}},
        {"ph": "X", "cat": "cpu_instant_event", "name": "i", "ts": 3.0, "dur": 0},
    ),
    "odd_fields_off_complete_events": lambda doc: [
        e.update(ts="x", name=3, cat=[1], args="x") for e in doc["traceEvents"] if e.get("ph") == "M"
    ],
    "kernel_args_null": lambda doc: _events("kernel")(doc)[0].__setitem__("args", None),
    "odd_arg_types": lambda doc: [
        _set_args("kernel", "correlation", "31")(doc),
        _set_args("gpu_memcpy", "correlation", 15.0)(doc),
        _set_args("gpu_memset", "External id", True)(doc),
        _set_args("kernel", "grid", [1, True, 3])(doc),
        _set_args("gpu_memcpy", "bytes", [1])(doc),
        _set_args("user_annotation", "External id", [1])(doc),  # never looked up: not refused
    ],
    "runtime_and_driver_share_a_name": _set_all("cuda_runtime", "name", "cuLaunchKernelEx"),
    "non_ascii_names": lambda doc: [
        e.__setitem__("name", e["name"] + " é ✓ 😀") for e in _events("kernel")(doc)
    ],
    "odd_top_level": lambda doc: doc.update(
        deviceProperties=[1, {"id": True, "name": 5, "computeMajor": 9, "computeMinor": "0"}],
        cuda_runtime_version=True,
        cupti_version="x",
        schemaVersion=1.0,
    ),
    "huge_int_ts": lambda doc: _events("kernel")(doc)[0].__setitem__("ts", 2**70 + 1),
}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_torch_trace_fast_path_matchesreference(tmp_path, monkeypatch, case):
    p = _trace(tmp_path, FAST_CASES[case])
    assert torch_trace.scan_fast(p.read_bytes()) is not None  # the fast path took it
    for kw in ({}, {"max_events": 5, "summary_limit": 2}):
        fast = outcome(p, **kw)
        assert isinstance(fast, str)
        assert fast == reference(p, monkeypatch, **kw) == python_fast(p, monkeypatch, **kw)


RAW = TRACE.read_bytes()
FIRST_KERNEL_TS = b'"ts": 5379723400681.117'

# text-level variants json.dumps cannot write: the fast path hands each one to the reference path
# or decodes it to the same values
TEXT_CASES = {
    "escaped_keys": (RAW.replace(b'"cat": "kernel"', b'"c\\u0061t": "kern\\u0065l"'), None),
    "duplicate_keys": (RAW.replace(b'"cat": "kernel"', b'"cat": "cpu_op", "cat": "kernel"'), None),
    "args_then_args": (
        RAW.replace(b'"args": {"External id": 7,', b'"args": [1], "args": {"External id": 7,', 1),
        None,
    ),
    "phase_not_chrome": (RAW.replace(b'"ph": "f"', b'"ph": "Z"', 1), None),
    "no_phase": (RAW.replace(b'"ph": "f", ', b"", 1), None),
    "two_phases": (
        RAW.replace(b'"ph": "X", "cat": "kernel"', b'"ph": "M", "ph": "X", "cat": "kernel"'),
        None,
    ),
    "dur_past_int64": (RAW.replace(b'"dur": 24.384', b'"dur": 1180591620717411303424', 1), None),
    "nan_skipped": (RAW.replace(b'"blocks per SM": 0.969697', b'"blocks per SM": NaN', 1), None),
    "nan_ts": (RAW.replace(FIRST_KERNEL_TS, b'"ts": NaN', 1), ("bad_value", ".ts")),
    "infinity_dur": (RAW.replace(b'"dur": 24.384', b'"dur": Infinity', 1), ("bad_value", ".dur")),
    "ts_past_float": (RAW.replace(FIRST_KERNEL_TS, b'"ts": 1e400', 1), ("bad_value", ".ts")),
    "ts_ns_past_float": (RAW.replace(FIRST_KERNEL_TS, b'"ts": 1e306', 1), ("bad_value", ".ts")),
    "bad_utf8_in_a_skipped_string": (RAW.replace(b'"bp": "e"', b'"bp": "\xff"', 1), ("not_json", "report")),
    "encoded_surrogate": (RAW.replace(b'"bp": "e"', b'"bp": "\xed\xa0\x80"', 1), ("not_json", "report")),
    "lone_surrogate_escape": (RAW.replace(b'"bp": "e"', b'"bp": "\\ud800"', 1), ("not_json", "report")),
    "control_character": (RAW.replace(b'"bp": "e"', b'"bp": "\x01"', 1), ("not_json", "report")),
    "bom": (b"\xef\xbb\xbf" + RAW, ("not_json", "report")),
    "trailing_garbage": (RAW + b" x", ("not_json", "report")),
    "truncated": (RAW[: len(RAW) // 2], ("not_json", "report")),
    "empty": (b"", ("not_json", "report")),
}


@pytest.mark.parametrize("case", sorted(TEXT_CASES))
def test_torch_trace_text_variants(tmp_path, monkeypatch, case):
    data, refusal = TEXT_CASES[case]
    p = _write(tmp_path, "t.json", data)
    got = outcome(p)
    assert got == reference(p, monkeypatch) == python_fast(p, monkeypatch)
    if refusal is None:
        assert isinstance(got, str) and json.loads(got)["events"] > 300
    else:
        assert isinstance(got, tuple) and got[1] == refusal[0] and got[2].endswith(refusal[1])


def test_torch_trace_unhashable_ids_are_refused(tmp_path, monkeypatch):
    # correlation and External id key the launch and op maps: a list or an object used to crash
    cases = {
        "api_correlation": (_set_args("cuda_runtime", "correlation", [1]), ".args.correlation"),
        "kernel_correlation": (_set_args("kernel", "correlation", [1]), ".args.correlation"),
        "op_external_id": (_set_args("cpu_op", "External id", {"a": 1}), ".args.External id"),
        "kernel_external_id": (_set_args("kernel", "External id", {"a": 1}), ".args.External id"),
        "schema_version": (lambda doc: doc.__setitem__("schemaVersion", [1]), "schemaVersion"),
    }
    for name, (mutate, field) in cases.items():
        p = _trace(tmp_path, mutate)
        r = refused(parse_torch_trace, p)
        assert r.code in ("bad_value", "unknown_schema_version") and r.field.endswith(field), name
        assert reference(p, monkeypatch) == ("refused", r.code, r.field, r.message), name


def test_torch_trace_parses_without_msgspec(tmp_path):
    # a Python without msgspec (an image built before it was listed) imports the parser and gets
    # the same facts from the reference path
    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "from cko_perf.operations.evidence import torch_trace as t\n"
        "assert t.msgspec is None and t.scan_fast(b'{}') is None\n"
        f"print(t.parse_torch_trace({str(TRACE)!r}).model_dump_json())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == parse_torch_trace(TRACE).model_dump_json()


# ---------------------------------------------------------------------------------------------
# Compiler evidence


def test_ptxas_report():
    p = parse_ptxas(SASS / "kernels.ptxas.txt")
    by = {f.name: f for f in p.functions}
    spill = by["_Z12spill_kernelPKfPfi"]
    assert spill.arch == "sm_90a" and spill.entry and spill.registers == 32
    assert (
        spill.stack_frame_bytes == 848
        and spill.spill_stores_bytes == 1148
        and spill.spill_loads_bytes == 1240
    )
    cp = by["_Z14cp_async_scalePK6float4PS_i"]
    assert cp.shared_memory_bytes == 4096 and cp.barriers == 1 and cp.spill_stores_bytes == 0
    assert by["_Z14copy_coalescedPK6float4PS_i"].registers == 14
    assert p.global_memory_bytes == {"?": 0} or p.global_memory_bytes


def test_ptxas_older_format_items(tmp_path):
    text = (
        "ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_80'\n"
        "ptxas info    : Function properties for _Z3fooPf\n"
        "    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 16 bytes lmem, 368 bytes cmem[0], 12 bytes cmem[2], 3 widgets\n"
        "ptxas warning : Registers are spilled to local memory in function '_Z3fooPf'\n"
    )
    f = parse_ptxas(_write(tmp_path, "p.txt", text)).functions[0]
    assert f.registers == 40 and f.local_memory_bytes == 16 and f.constant_memory_bytes == {"0": 368, "2": 12}
    assert f.unmodeled == ["3 widgets"]


def test_sass_dump_of_the_cuda_kernels():
    s = parse_sass(SASS / "kernels.sass")
    assert s.archs == ["sm_90a"]
    by = {f.name: f for f in s.functions}
    spill = by["_Z12spill_kernelPKfPfi"]
    assert spill.uses_local_memory and spill.local_loads > 100 and spill.local_stores > 100
    assert "local_memory" in spill.flags
    wmma = by["_Z9wmma_gemmPK6__halfS1_Pfiii"]
    assert wmma.tensor_core.get("HMMA", 0) > 0 and "HMMA.16816.F32" in wmma.opcodes_full
    assert by["_Z14copy_coalescedPK6float4PS_i"].global_load_widths == {"16": 1}
    assert by["_Z12copy_stridedPKfPfii"].global_load_widths == {"4": 1}
    cp = by["_Z14cp_async_scalePK6float4PS_i"]
    assert cp.ldgsts == 1 and "LDGSTS" in cp.flags and cp.global_load_widths == {}
    for f in s.functions:
        assert f.instructions == sum(f.opcodes.values()) == sum(f.opcodes_full.values())
        assert not any("@" in op or "." in op for op in f.opcodes)
        assert not f.uses_local_memory or f is spill


def test_sass_dump_of_triton_hopper_kernels():
    ptr = parse_sass(SASS / "triton_matmul_ptr.sass").functions[0]
    assert ptr.name == "matmul_ptr" and ptr.arch == "sm_90a"
    assert ptr.tensor_core.get("HGMMA", 0) > 0 and ptr.ldgsts > 0 and not ptr.tma
    tma = parse_sass(SASS / "triton_matmul_tma.sass").functions[0]
    assert tma.tma.get("UTMALDG", 0) > 0 and tma.tma.get("UTMASTG", 0) > 0 and tma.ldgsts == 0
    assert any(op.startswith("HGMMA.64x128x16") for op in tma.opcodes_full)


def test_resource_usage_agrees_with_ptxas():
    r = {f.name: f.values for f in parse_resource_usage(SASS / "kernels.resource.txt").functions}
    p = {f.name: f for f in parse_ptxas(SASS / "kernels.ptxas.txt").functions}
    assert set(r) == set(p)
    for name, v in r.items():
        assert v["REG"] == p[name].registers
        assert v["STACK"] == p[name].stack_frame_bytes


def test_compiler_evidence_fact_set_and_identity():
    f = parse_compiler_evidence(sass=SASS / "kernels.sass", ptxas=SASS / "kernels.ptxas.txt", bound_to=H200)
    assert f.report_identity.compute_capability == "9.0" and f.identity_mismatch == []
    g = parse_compiler_evidence(sass=SASS / "kernels.sass", bound_to=Binding(compute_capability="8.0"))
    assert [m.field for m in g.identity_mismatch] == ["compute_capability"]


def test_compiler_evidence_refusals(tmp_path):
    junk = _write(tmp_path, "junk.txt", "hello\nworld\n")
    assert refused(parse_sass, junk).code == "not_sass_dump"
    assert refused(parse_ptxas, junk).code == "not_ptxas_output"
    assert refused(parse_resource_usage, junk).code == "not_resource_usage"
    assert refused(parse_sass, SASS / "kernels.sm_90a.cubin").code == "not_text"
    assert refused(parse_compiler_evidence).code == "bad_request"


# ---------------------------------------------------------------------------------------------
# The in-container operation mains


def _result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_op_profile_ncu(tmp_path):
    out = tmp_path / "o"
    rc = profile_ncu.main(
        [
            "--report",
            str(NCU / "kernels_raw.csv"),
            "--version-file",
            str(NCU / "ncu_version.txt"),
            "--bind-gpu-name",
            "NVIDIA H200",
            "--bind-compute-capability",
            "9.0",
            "--out",
            str(out),
        ]
    )
    doc = _result(out)
    assert rc == 0 and doc["kind"] == "ncu" and len(doc["launches"]) == 6 and doc["identity_mismatch"] == []
    assert doc["bound_to"]["gpu_name"] == "NVIDIA H200"
    rc = profile_ncu.main(["--report", str(NCU / "kernels_raw.csv"), "--out", str(out)])
    doc = _result(out)
    assert rc == 1 and doc == {
        "error": "unknown_tool_version",
        "message": doc["message"],
        "field": "tool_version",
    }


def test_op_profile_nsys_and_torch(tmp_path):
    assert profile_nsys.main(["--report", str(NSYS_DB), "--out", str(tmp_path / "n")]) == 0
    assert _result(tmp_path / "n")["kind"] == "nsys"
    assert profile_nsys.main(["--report", str(TRACE), "--out", str(tmp_path / "n2")]) == 1
    assert _result(tmp_path / "n2")["error"] == "not_sqlite"
    assert (
        profile_torch.main(["--report", str(TRACE), "--tool-version", "2.11.0", "--out", str(tmp_path / "t")])
        == 0
    )
    assert _result(tmp_path / "t")["tool_version"] == "2.11.0"
    assert profile_torch.main(["--report", str(NSYS_DB), "--out", str(tmp_path / "t2")]) == 1
    assert _result(tmp_path / "t2")["error"] == "not_json"


def test_op_bad_arguments(tmp_path, capsys):
    assert profile_torch.main(["--out", str(tmp_path / "x")]) == 2
    assert _result(tmp_path / "x")["error"] == "bad_arguments"
    assert (
        profile_ncu.main(
            [
                "--report",
                str(NCU / "kernels_raw.csv"),
                "--max-unmodeled-launches",
                "lots",
                "--out",
                str(tmp_path / "y"),
            ]
        )
        == 2
    )
    assert "Traceback" not in capsys.readouterr().err


def test_op_sass(tmp_path):
    out = tmp_path / "s"
    rc = sass_op.main(
        [
            "--sass",
            str(SASS / "kernels.sass"),
            "--ptxas",
            str(SASS / "kernels.ptxas.txt"),
            "--resource",
            str(SASS / "kernels.resource.txt"),
            "--out",
            str(out),
        ]
    )
    doc = _result(out)
    assert rc == 0 and len(doc["sass"]["functions"]) == 5 and len(doc["ptxas"]["functions"]) == 5
    assert sass_op.main(["--sass", str(NCU / "kernels_raw.csv"), "--out", str(tmp_path / "s2")]) == 1
    assert _result(tmp_path / "s2")["error"] == "not_sass_dump"


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not on PATH")
def test_op_sass_binary_runs_cuobjdump(tmp_path):
    out = tmp_path / "b"
    assert sass_op.main(["--binary", str(SASS / "triton_matmul_tma.cubin"), "--out", str(out)]) == 0
    doc = _result(out)
    fn = doc["sass"]["functions"][0]
    assert fn["name"] == "matmul_tma" and fn["tma"]["UTMALDG"] > 0
    assert (out / "sass.txt").is_file() and (out / "resource_usage.txt").is_file()
    assert sass_op.main(["--binary", str(NCU / "kernels_raw.csv"), "--out", str(tmp_path / "c")]) == 1
    assert _result(tmp_path / "c")["error"] == "not_cuda_binary"


# `python -I -m operations` as the image runs it: there /opt/cko/src (holding operations/) is on the
# isolated interpreter's path; here the repository root is, and only in that one process (the host
# itself imports operations as cko_perf.operations).
_AS_IN_THE_IMAGE = (
    "import runpy, sys; sys.path.insert(0, {root!r}); runpy.run_module('operations', run_name='__main__')"
)


def _isolated_operation(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", _AS_IN_THE_IMAGE.format(root=str(ROOT)), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_ops_dispatch_through_python_isolated(tmp_path):
    out = tmp_path / "d"
    report = ["--tool-version", "2025.3.1", "--out", str(out)]
    proc = _isolated_operation("profile-ncu", "--report", str(NCU / "kernels_details_full.csv"), *report)
    assert proc.returncode == 0, proc.stderr
    assert _result(out)["page"] == "details"
    bad = _isolated_operation("profile-ncu", "--report", str(NSYS_DB), *report)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert _result(out)["error"] in ("not_text", "not_ncu_csv")


# ---------------------------------------------------------------------------------------------
# The host CLI through the sandbox (needs Docker and the cpu/cuda images)


def _cko(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CKO_STORE=str(store))
    return subprocess.run(
        [sys.executable, "-m", "cko_perf", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )


@pytest.mark.docker
def test_cli_profile_ncu(tmp_path):
    p = _cko(
        "profile",
        "ncu",
        "--report",
        str(NCU / "kernels_raw.csv"),
        "--version-file",
        str(NCU / "ncu_version.txt"),
        store=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    facts = doc["facts"]
    assert doc["invocation_id"] and facts["kind"] == "ncu" and len(facts["launches"]) == 6
    assert facts["launches"][3]["name"].startswith("spill_kernel")
    assert (
        facts["report_sha256"]
        == __import__("hashlib").sha256((NCU / "kernels_raw.csv").read_bytes()).hexdigest()
    )
    q = _cko("profile", "ncu", "--report", str(NCU / "kernels_raw.csv"), store=tmp_path)
    assert q.returncode == 1
    assert json.loads(q.stdout)["error"] == "unknown_tool_version"


@pytest.mark.docker
def test_cli_profile_nsys_torch_and_sass(tmp_path):
    n = _cko("profile", "nsys", "--report", str(NSYS_DB), store=tmp_path)
    assert n.returncode == 0, n.stderr
    assert json.loads(n.stdout)["facts"]["counts"]["CUPTI_ACTIVITY_KIND_KERNEL"] == 21
    t = _cko("profile", "torch", "--report", str(TRACE), store=tmp_path)
    assert t.returncode == 0, t.stderr
    assert json.loads(t.stdout)["facts"]["gpu_events"] == 36
    bad = _cko("profile", "nsys", "--report", str(TRACE), store=tmp_path)
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"] == "not_sqlite"
    s = _cko(
        "sass",
        "--sass",
        str(SASS / "kernels.sass"),
        "--ptxas",
        str(SASS / "kernels.ptxas.txt"),
        store=tmp_path,
    )
    assert s.returncode == 0, s.stderr
    assert len(json.loads(s.stdout)["facts"]["sass"]["functions"]) == 5


@pytest.mark.docker
def test_cli_sass_binary_in_the_cuda_image(tmp_path):
    p = _cko("sass", "--binary", str(SASS / "kernels.sm_90a.cubin"), store=tmp_path)
    if p.returncode == 5:
        pytest.skip("the cuda image is not built here: " + p.stdout[-300:])
    assert p.returncode == 0, p.stderr
    fns = {f["name"]: f for f in json.loads(p.stdout)["facts"]["sass"]["functions"]}
    assert fns["_Z12spill_kernelPKfPfi"]["uses_local_memory"]


@pytest.mark.docker
def test_cli_missing_report_is_a_bad_request(tmp_path):
    p = _cko("profile", "torch", "--report", str(tmp_path / "nope.json"), store=tmp_path)
    assert p.returncode == 2 and json.loads(p.stdout)["field"] == "report"


@pytest.mark.docker
def test_cli_parse_stopped_at_its_memory_limit_says_so(tmp_path):
    """A report whose parse outgrows the container's memory: exit 1 naming --memory, recorded, store intact."""
    store = tmp_path / "store"
    small = _cko("profile", "torch", "--report", str(TRACE), "--memory", "128m", store=store)
    assert small.returncode == 0, small.stderr  # the limit leaves the parser itself room
    big = tmp_path / "big.json"
    event = b'{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":1,"dur":1,"args":{}},'
    with open(big, "wb") as f:  # a well-formed trace of 200 MB: its bytes alone pass the limit
        f.write(b'{"traceEvents":[')
        for _ in range(20):
            f.write(event * (10_000_000 // len(event)))
        f.write(event[:-1] + b"]}")
    p = _cko("profile", "torch", "--report", str(big), "--memory", "128m", store=store)
    assert p.returncode == 1, p.stdout + p.stderr
    err = json.loads(p.stdout)
    assert err["error"] == "out_of_memory" and err["field"] == "memory" and "128m" in err["message"]
    results = [json.loads(r.read_text()) for r in (store / "invocations").glob("*/result.json")]
    assert sorted(r["state"] for r in results) == ["failed", "succeeded"]
    assert "OOM" in next(r["reason"] for r in results if r["state"] == "failed")
    # a limit that is not a size is refused before anything is written
    q = _cko("profile", "torch", "--report", str(TRACE), "--memory", "lots", store=store)
    assert q.returncode == 2 and json.loads(q.stdout)["field"] == "memory"
    assert len(list((store / "invocations").iterdir())) == 2
    v = subprocess.run(
        [sys.executable, "-m", "cko_perf", "verify", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, CKO_STORE=str(store)),
        timeout=300,
    )
    assert json.loads(v.stdout)["ok"] is True, v.stdout


# ---------------------------------------------------------------------------------------------
# The host CLI's own logic (argument mapping, inputs, exit codes, renderings), with the sandbox
# replaced by running the same operation in-process on the same inputs. The docker tests above
# run it for real.


@pytest.fixture
def in_process_sandbox(monkeypatch, tmp_path):
    """The local executor replaced by one that runs the Plan's operation in-process: every evidence
    command reaches it through the executor seam (OperationRequest → Plan → executor → result)."""
    from cko_perf.runner.executor import LocalExecutor
    from cko_perf.runner.invocation import Outcome
    from cko_perf.runner.operation import INPUT_ROOT, OPERATION
    from cko_perf.runner.records import InvocationResult

    calls: list[dict] = []

    def execute(self, store, plan, progress=None, keep_outputs=False):
        n = len(calls)
        assert plan.command[: len(OPERATION)] == OPERATION and plan.command[-2:] == ["--out", "/cko/out"]
        op, *args = plan.command[len(OPERATION) : -2]
        inputs = {Path(m.target).name: Path(m.source) for m in plan.mounts}
        assert all(m.read_only and m.target.startswith(INPUT_ROOT + "/") for m in plan.mounts)
        calls.append({"op": op, "args": args, "inputs": inputs, "image": plan.image, "label": plan.label})
        indir, out = tmp_path / f"in{n}", tmp_path / f"inv-{n}" / "out"
        indir.mkdir()
        for name, src in inputs.items():
            shutil.copyfile(src, indir / name)  # staged by run_operation, removed when it returns
        from cko_perf.operations.__main__ import main as ops_main

        code = ops_main([op, *(a.replace(INPUT_ROOT, str(indir)) for a in args), "--out", str(out)])
        result = InvocationResult(
            id=f"inv-{n}",
            op=plan.op,
            state="succeeded" if code == 0 else "failed",
            exit_code=code,
            container_exit_code=code,
            ended_at="2026-01-01T00:00:00+00:00",
            request_sha256="0" * 64,
        )
        return Outcome(id=result.id, result=result, out_dir=out, meta={})

    monkeypatch.setattr(LocalExecutor, "__call__", execute)
    return calls


def _cli(*args: str):
    from click.testing import CliRunner

    from cko_perf.runner.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_glue_profile_ncu(in_process_sandbox, tmp_path):
    store = str(tmp_path / "store")
    r = _cli(
        "profile",
        "ncu",
        "--report",
        str(NCU / "kernels_raw.csv"),
        "--version-file",
        str(NCU / "ncu_version.txt"),
        "--store",
        store,
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["op"] == "profile-ncu" and len(doc["facts"]["launches"]) == 6
    call = in_process_sandbox[0]
    assert call["image"] == "cpu" and set(call["inputs"]) == {"report.csv", "ncu-version.txt"}
    refusal = _cli("profile", "ncu", "--report", str(NCU / "kernels_raw.csv"), "--store", store, "--json")
    assert refusal.exit_code == 1
    assert json.loads(refusal.stdout)["error"] == "unknown_tool_version"
    human = _cli(
        "profile",
        "ncu",
        "--report",
        str(NCU / "kernels_raw.csv"),
        "--tool-version",
        "2025.3.1",
        "--store",
        store,
    )
    assert human.exit_code == 0 and "ncu-csv-2025.3" in human.output and "invocation inv-" in human.output


def test_cli_glue_sidecar_version_and_other_commands(in_process_sandbox, tmp_path):
    store = str(tmp_path / "store")
    rep = tmp_path / "r.csv"
    shutil.copy(NCU / "kernels_details_full.csv", rep)
    shutil.copy(NCU / "ncu_version.txt", str(rep) + ".version")
    assert _cli("profile", "ncu", "--report", str(rep), "--store", store, "--json").exit_code == 0
    assert _cli("profile", "nsys", "--report", str(NSYS_DB), "--store", store).exit_code == 0
    t = _cli("profile", "torch", "--report", str(TRACE), "--store", store, "--json")
    assert t.exit_code == 0 and json.loads(t.stdout)["facts"]["gpu_events"] == 36
    s = _cli(
        "sass",
        "--sass",
        str(SASS / "kernels.sass"),
        "--ptxas",
        str(SASS / "kernels.ptxas.txt"),
        "--store",
        store,
    )
    assert s.exit_code == 0 and "HMMA" in s.output
    assert in_process_sandbox[-1]["image"] == "cpu"
    req = tmp_path / "req.json"
    req.write_text(
        json.dumps(
            {
                "source": {"kind": "torch", "report": str(TRACE)},
                "remove": [{"label": "g", "contains": ["nvjet"]}],
            }
        )
    )
    m = _cli("execution-map", "--request", str(req), "--store", store, "--json")
    assert m.exit_code == 0 and json.loads(m.stdout)["facts"]["removable"][0]["matched_intervals"] == 3
    assert set(in_process_sandbox[-1]["inputs"]) == {"request.json", "report"}


def test_cli_glue_bad_requests(in_process_sandbox, tmp_path):
    store = str(tmp_path / "store")
    r = _cli("profile", "torch", "--report", str(tmp_path / "missing.json"), "--store", store, "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["field"] == "report"
    assert _cli("sass", "--store", store, "--json").exit_code == 2
    both = _cli(
        "sass",
        "--binary",
        str(SASS / "kernels.sm_90a.cubin"),
        "--sass",
        str(SASS / "kernels.sass"),
        "--store",
        store,
    )
    assert both.exit_code == 2
    assert in_process_sandbox == []  # nothing ran


def test_operation_request_is_typed_and_reaches_the_executor_as_its_plan(tmp_path, monkeypatch):
    """run_operation's one path: the typed request, staged and lowered to a Plan, goes to the
    executor it is given; what comes back is a typed OperationResult."""
    from pydantic import ValidationError

    from cko_perf.runner.invocation import Outcome
    from cko_perf.runner.operation import OperationRequest, OperationResult, run_operation
    from cko_perf.runner.records import InvocationResult
    from cko_perf.runner.store import Store

    for bad in ("a/b", ".hidden", ""):
        with pytest.raises(ValidationError):
            OperationRequest(op="sass", inputs={bad: TRACE})
    with pytest.raises(ValidationError):
        OperationRequest(op="sass", timeout_s=0)
    req = OperationRequest(
        op="profile-torch",
        args=["--report", "/cko/in/trace.json"],
        inputs={"trace.json": TRACE},
        memory="1g",
        parent={"collection": {"id": "inv-x"}},
        label="parse",
    )
    seen = []

    class Recording:
        def __call__(self, store, plan, progress=None, keep_outputs=False):
            (mount,) = plan.mounts
            seen.append((plan, Path(mount.source).read_bytes(), keep_outputs))
            out = tmp_path / "inv-1" / "out"
            out.mkdir(parents=True)
            (out / "result.json").write_text('{"kind": "torch"}')
            res = InvocationResult(
                id="inv-1", op=plan.op, state="succeeded", exit_code=0, container_exit_code=0,
                ended_at="2026-01-01T00:00:00+00:00", request_sha256="0" * 64,
            )  # fmt: skip
            return Outcome(id="inv-1", result=res, out_dir=out, meta={}, where={"node_id": "n1"})

        def preflight(self, image, gpus):
            return []

    monkeypatch.setenv("CKO_PARSE_IMAGE", "cuda")
    store = Store(tmp_path / "store")
    result = run_operation(store, req, Recording())
    ((plan, staged, kept),) = seen
    assert kept and staged == TRACE.read_bytes() and plan.image == "cuda"  # the cpu image's stand-in
    assert plan.command[4:] == ["profile-torch", "--report", "/cko/in/trace.json", "--out", "/cko/out"]
    assert (plan.op, plan.memory, plan.parent, plan.label) == ("profile-torch", "1g", req.parent, "parse")
    assert plan.mounts[0].target == "/cko/in/trace.json" and plan.mounts[0].read_only
    assert isinstance(result, OperationResult) and result.doc == {"kind": "torch"}
    assert (result.invocation_id, result.state, result.exit_code) == ("inv-1", "succeeded", 0)
    assert result.where == {"node_id": "n1"}
    assert not list(store.scratch().iterdir())  # the staged copies are gone
