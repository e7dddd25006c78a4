"""The compiled trace scanner (operations/evidence/native/trace_scan.c) against the Python paths.

The scanner declines whatever it cannot vouch for, and the Python paths then decide; so what it
must get right is what it accepts. Every test here parses the same bytes with the scanner on and
with the reference path alone (no msgspec, no scanner) and wants the same facts or the same
refusal, and checks that the scanner did take the inputs it is meant to take.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pytest
from trace_outcomes import outcome, reference

from cko_perf.operations.evidence import torch_trace, trace_native
from cko_perf.runner import native

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "fixtures" / "torch" / "torch_trace.json"
RAW = TRACE.read_bytes()

needs_native = pytest.mark.skipif(
    not trace_native.available(), reason="the trace scanner is not built (make native)"
)


def test_the_scanner_is_built_where_make_test_requires_it():
    if os.environ.get("CKO_REQUIRE_NATIVE") != "1":
        pytest.skip("CKO_REQUIRE_NATIVE is not 1 (no C compiler on this host)")
    assert trace_native.available(), "make native did not build a library matching trace_scan.c"
    assert (
        native.built_from(trace_native.LIBRARY)
        == hashlib.sha256(trace_native.SOURCE.read_bytes()).hexdigest()
    )


def _took(data: bytes, max_events: int = torch_trace.DEFAULT_MAX_EVENTS) -> bool:
    return torch_trace.scan_native(data, max_events) is not None


def _same(tmp_path: Path, monkeypatch, data: bytes, name: str = "t.json", **kw) -> str | tuple:
    p = tmp_path / name
    p.write_bytes(data)
    got = outcome(p, **kw)
    assert got == reference(p, monkeypatch, **kw)
    return got


@needs_native
def test_the_scanner_takes_the_real_trace_and_matches(tmp_path, monkeypatch):
    assert _took(RAW)
    for kw in ({}, {"max_events": 0}, {"max_events": 5, "summary_limit": 2}):
        got = _same(tmp_path, monkeypatch, RAW, **kw)
        assert isinstance(got, str) and json.loads(got)["gpu_events"] == 36


def _kernels(times: list[tuple[str, str]], extra: str = "") -> bytes:
    """A trace of kernel events whose ts and dur are the given number texts, verbatim."""
    events = [
        f'{{"ph": "X", "cat": "kernel", "name": "k{i % 7}", "ts": {ts}, "dur": {dur}, '
        f'"args": {{"correlation": {i}, "device": 0, "stream": 7, "grid": [1, 2, 3]}}}}'
        for i, (ts, dur) in enumerate(times)
    ]
    launches = [
        f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.5, "dur": 2, '
        f'"args": {{"correlation": {i}}}}}'
        for i in range(0, len(times), 3)
    ]
    return (
        '{"schemaVersion": 1, ' + extra + '"traceEvents": [' + ", ".join(events + launches) + "]}"
    ).encode()


def _number_texts(rng: random.Random, n: int) -> list[str]:
    """Number texts of every shape a writer may use, within what the scanner converts."""
    out = [
        "0",
        "-0",
        "0.0",
        "-0.0",
        "7",
        "-7",
        "0.0005",
        "0.0015",
        "0.0025",
        "2.5e-3",
        "1E3",
        "1e+3",
        "15E-1",
        "0.000123",
        "123456.789",
        "5379723397520.891",
        "9007199254.740993",
        "1234567890123456.7891",  # past 2^53 as a mantissa: the strtod path
        "123456789012.345678901234567",  # more than 19 digits: the strtod path
        "0.1234567890123456789012345",
        "922337203685",
        "-922337203685",
        "4503599627370.4995",
        "1e-300",
        "3.0000000000000004",
    ]
    while len(out) < n:
        x = rng.choice([rng.uniform(0, 1e4), rng.uniform(1e9, 1e13), rng.uniform(-1e6, 1e6), rng.random()])
        form = rng.randrange(6)
        if form == 0:
            out.append(repr(x))
        elif form == 1:
            out.append(f"{x:.3f}")
        elif form == 2:
            out.append(f"{x:.17g}")
        elif form == 3:
            out.append(f"{x:.6e}")
        elif form == 4:
            out.append(str(int(x)))
        else:  # an exact half after the scale: the round-half-even cases
            out.append(f"{int(x)}.{rng.choice(['0005', '0015', '5', '4995', '5005'])}")
    return out


@needs_native
def test_number_conversion_matches_python(tmp_path, monkeypatch):
    rng = random.Random(20261203)
    texts = _number_texts(rng, 3000)
    durs = [t.lstrip("-") for t in texts]  # a negative dur is refused: that is another test
    data = _kernels(list(zip(texts, reversed(durs), strict=True)))
    assert _took(data, 10_000), "the scanner declined plain numbers"
    got = _same(tmp_path, monkeypatch, data, max_events=10_000)
    facts = json.loads(got)
    assert facts["gpu_events"] == 3000 and facts["gpu_events_correlated"] == 1000
    # and each ts as Python computes it, event by event
    want = sorted(round(float(t) * 1000) if any(c in t for c in ".eE") else int(t) * 1000 for t in texts)
    assert [e["start_ns"] for e in facts["gpu"]] == want


@pytest.mark.parametrize(
    "ts,dur",
    [
        ("9223372036854776", "1"),  # ts in ns past int64
        ("1", "-0.001"),  # negative
        ("1e400", "1"),  # past double
        ("1", "1e306"),  # past double once scaled
        ("123456789012345678901", "1"),  # an integer past int64
        ("1" + "0" * 200 + ".5", "1"),  # past the text the scanner converts
    ],
)
def test_numbers_the_scanner_declines_are_decided_alike(tmp_path, monkeypatch, ts, dur):
    data = _kernels([("1.5", "2.5"), (ts, dur)])
    assert not trace_native.available() or not _took(data)
    _same(tmp_path, monkeypatch, data)


# inputs the scanner declines by design: each must still come out as the reference path says
DECLINED = {
    "escaped_name": RAW.replace(b'"name": "aten::to"', b'"name": "aten::\\u0074o"', 1),
    "escaped_key": RAW.replace(b'"dur": 24.384', b'"d\\u0075r": 24.384', 1),
    "duplicate_correlation": RAW.replace(b'"correlation": 31,', b'"correlation": 31, "correlation": 31,', 1),
    "string_correlation": RAW.replace(b'"correlation": 31,', b'"correlation": "31",', 1),
    "deep_args": RAW.replace(b'"queued": 0,', b'"queued": ' + b"[" * 100 + b"]" * 100 + b",", 1),
    "surrogate_pair_escape": RAW.replace(b'"bp": "e"', b'"bp": "\\ud83d\\ude00"', 1),
    "args_a_list": RAW[: RAW.index(b'"args": {', RAW.index(b'"cat": "kernel"'))]
    + b'"args": [7], "argz": '
    + RAW[RAW.index(b'"args": {', RAW.index(b'"cat": "kernel"')) + len(b'"args": ') :],
}


@needs_native
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_declined_inputs_are_decided_by_the_python_paths(tmp_path, monkeypatch, case):
    data = DECLINED[case]
    assert data != RAW, "the variant did not apply"
    assert not _took(data)
    _same(tmp_path, monkeypatch, data)


@needs_native
def test_many_categories_and_colliding_ids(tmp_path, monkeypatch):
    # more distinct categories than the scanner keeps (it declines), then ids spaced to collide in
    # a masked table (it must stay correct and finish)
    many = [{"ph": "X", "cat": f"c{i}", "name": "n", "ts": 1, "dur": 1} for i in range(300)]
    doc = json.loads(RAW)
    doc["traceEvents"] += many
    data = json.dumps(doc).encode()
    assert not _took(data)
    _same(tmp_path, monkeypatch, data)
    times = [(str(i), "1") for i in range(2000)]
    spaced = _kernels(times).replace(b'"correlation": ', b'"correlation": 1048576')
    assert _took(spaced)
    got = _same(tmp_path, monkeypatch, spaced)
    assert json.loads(got)["gpu_events_correlated"] == 667


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(b))
        op = rng.randrange(6)
        if op == 0:  # a byte JSON gives meaning to, or one it forbids
            b[i] = rng.choice(b'"\\{}[],:0-.eE tn\x00\x1f\x7f\x80\xc3\xed\xff')
        elif op == 1:
            del b[i : i + rng.randint(1, 40)]
        elif op == 2:
            j = rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 60)]
        elif op == 3:  # a digit changed: values, not syntax
            j = b.find(b"1", i)
            if j >= 0:
                b[j] = rng.choice(b"0123456789")
        elif op == 4:
            del b[rng.randrange(len(b) // 2, len(b)) :]
        else:
            b[i:i] = rng.choice([b"-", b"e9", b".5", b"null", b'"x"', b"[]", b"{}", b"\\u0041", b"1e400"])
    return bytes(b)


@needs_native
def test_random_mutations_of_the_real_trace(tmp_path, monkeypatch):
    rng = random.Random(7)
    taken = refused = 0
    for k in range(1000):
        data = _mutate(rng, RAW)
        took = _took(data)
        got = _same(tmp_path, monkeypatch, data, name=f"m{k}.json")
        taken += took
        refused += isinstance(got, tuple)
        if took:
            assert isinstance(got, str), f"mutant {k}: the scanner took what the reference refuses"
    # the mix must exercise both sides, or this test says little
    assert taken >= 100 and refused >= 100, (taken, refused)


def test_a_stale_or_foreign_library_is_not_used(tmp_path):
    if not trace_native.available():
        pytest.skip("the trace scanner is not built (make native)")
    src = tmp_path / "trace_scan.c"
    lib = tmp_path / "trace_scan.so"
    shutil.copy(trace_native.SOURCE, src)
    shutil.copy(trace_native.LIBRARY, lib)
    assert trace_native.load(lib, src) is not None
    src.write_bytes(src.read_bytes() + b"\n/* edited after the build */\n")
    assert trace_native.load(lib, src) is None
    (tmp_path / "junk.so").write_bytes(b"\x7fELF not really")
    assert trace_native.load(tmp_path / "junk.so", src) is None
