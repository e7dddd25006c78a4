"""The GPU examples' drivers, exercised without a GPU (and, where one is present, on it).

torch-layernorm runs end to end on CPU through `operations.driver.drive`: both subjects pass
accuracy against the float64 reference, a wrong implementation fails it. Its Triton kernel is
also run through Triton's interpreter where triton is importable. cuda-reduce needs a GPU and
nvcc: without a GPU its `load` refuses with a clear error; its kernels are compiled wherever nvcc
exists. Tests marked gpu run both examples on a CUDA device and skip where none is present.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cko_perf.operations.driver import drive
from cko_perf.operations.protocol import DriverRequest, validate_result

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LAYERNORM = EXAMPLES / "torch-layernorm"
REDUCE = EXAMPLES / "cuda-reduce"
_ids = itertools.count()


def _driver(example: Path):
    spec = importlib.util.spec_from_file_location(
        f"example_driver_{example.name.replace('-', '_')}_{next(_ids)}", example / "driver.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _request(
    subjects: dict[str, Path],
    cases: dict[str, dict],
    tmp_path: Path,
    *,
    rel_l2: float,
    entry: str,
    device: str = "cpu",
    reps: int = 2,
) -> DriverRequest:
    schedule = []
    for case in cases:
        for rep in range(reps):
            order = list(subjects) if rep % 2 == 0 else list(reversed(subjects))
            schedule += [{"subject": s, "case": case, "rep": rep} for s in order]
    return DriverRequest.model_validate(
        {
            "protocol": "cko/driver-v1",
            "mode": "measure",
            "subjects": [{"id": k, "path": str(v)} for k, v in subjects.items()],
            "cases": [{"id": k, "params": v} for k, v in cases.items()],
            "schedule": schedule,
            "warmup": 1,
            "metrics": [
                {"name": "time", "unit": "ms"},
                {"name": "bandwidth", "unit": "GB/s", "direction": "higher"},
            ],
            "accuracy": {"rel_l2": rel_l2, "check_fraction": 1.0},
            "seed": 11,
            "result_path": str(tmp_path / "result.json"),
            "device": device,
            "entry": entry,
        }
    )


def _drive(example: Path, req: DriverRequest):
    d = _driver(example)
    kwargs = {"load": d.load} if hasattr(d, "load") else {}
    res = drive(req, d.make_inputs, d.run, d.reference, extra_metrics=d.EXTRA_METRICS, **kwargs)
    assert validate_result(req, res) == []
    assert res.integrity == []
    return {(s.subject, s.case): s for s in res.series}


LN_SUBJECTS = {"original": LAYERNORM, "candidate": LAYERNORM / "candidate"}


@pytest.mark.parametrize(("dtype", "tol", "seen_max"), [("fp32", 1e-5, 1e-6), ("bf16", 1e-2, 4e-3)])
def test_layernorm_both_subjects_pass_on_cpu(tmp_path, dtype, tol, seen_max):
    cases = {
        "pow2": {"rows": 64, "cols": 512, "dtype": dtype},
        "odd": {"rows": 37, "cols": 1000, "dtype": dtype, "shift": -2.0, "scale": 0.5},
    }
    series = _drive(LAYERNORM, _request(LN_SUBJECTS, cases, tmp_path, rel_l2=tol, entry="kernel.py"))
    assert len(series) == 4
    for (subject, case), s in series.items():
        assert s.accuracy.passed, (subject, case, s.accuracy.detail)
        assert s.accuracy.checks == 2
        assert s.accuracy.worst_rel_l2 is not None and 0 < s.accuracy.worst_rel_l2 < seen_max
        assert all(v > 0 for v in s.samples["time"]) and all(v > 0 for v in s.samples["bandwidth"])


def test_layernorm_same_inputs_for_both_subjects(tmp_path):
    series = _drive(
        LAYERNORM,
        _request(LN_SUBJECTS, {"c": {"rows": 16, "cols": 256}}, tmp_path, rel_l2=1e-2, entry="kernel.py"),
    )
    a, b = series[("original", "c")].accuracy, series[("candidate", "c")].accuracy
    assert a.input_seeds == b.input_seeds and len(set(a.input_seeds)) == 2


def test_layernorm_wrong_implementation_fails(tmp_path):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "kernel.py").write_text(
        "import torch\n\n\n"
        "def layer_norm(x, weight, bias, eps=1e-5):\n"
        "    # forgets the bias\n"
        "    xf = x.float()\n"
        "    y = (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)\n"
        "    return (y * weight.float()).to(x.dtype)\n"
    )
    series = _drive(
        LAYERNORM,
        _request(
            {"original": LAYERNORM, "wrong": wrong},
            {"c": {"rows": 32, "cols": 384}},
            tmp_path,
            rel_l2=1e-2,
            entry="kernel.py",
        ),
    )
    assert series[("original", "c")].accuracy.passed
    bad = series[("wrong", "c")].accuracy
    assert not bad.passed and bad.worst_rel_l2 > 1e-2 and "rel_l2" in bad.detail


_INTERPRETED = """
import importlib.util, json, sys
import numpy as np
from cko_perf.operations.driver import load_subject
example = sys.argv[1]
spec = importlib.util.spec_from_file_location("ln_driver", example + "/driver.py")
d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d)
cand = load_subject("interpreted", example + "/candidate", "kernel.py")
assert type(cand._layer_norm_fwd).__name__ == "InterpretedFunction", type(cand._layer_norm_fwd)
rng = np.random.default_rng(3)
out = []
for case in json.loads(sys.argv[2]):
    inputs = d.make_inputs(case, rng, "cpu")
    y = d.run(cand, inputs)
    ref = d.reference(case, inputs)
    rel = float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))
    out.append({"rel": rel, "dtype_ok": y.dtype == inputs["x"].dtype, "shape_ok": y.shape == inputs["x"].shape})
print(json.dumps(out))
"""


def test_layernorm_candidate_triton_kernel_interpreted():
    """The Triton kernel itself, through Triton's CPU interpreter (TRITON_INTERPRET must be set before
    triton is first imported, hence a fresh process). The interpreter rounds fp32 -> bf16 toward
    zero where the GPU rounds to nearest, so its bf16 error is about twice the GPU's."""
    pytest.importorskip("triton")
    cases = [
        ({"rows": 9, "cols": 1000, "dtype": "fp32"}, 1e-5),
        ({"rows": 5, "cols": 1, "dtype": "fp32", "shift": 0.0}, 1e-5),
        ({"rows": 3, "cols": 4096, "dtype": "fp32", "shift": 50.0}, 1e-5),
        ({"rows": 7, "cols": 2048, "dtype": "bf16"}, 1e-2),
    ]
    # the example's driver imports the top-level `operations`, as in the image: the root on its path
    path = os.pathsep.join(p for p in (str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", _INTERPRETED, str(LAYERNORM), json.dumps([c for c, _ in cases])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == len(cases)
    for (case, tol), g in zip(cases, got, strict=True):
        assert g["dtype_ok"] and g["shape_ok"], case
        assert g["rel"] < tol, (case, g["rel"])


def test_layernorm_min_bytes_and_flops():
    d = _driver(LAYERNORM)
    assert d.min_bytes({"rows": 32768, "cols": 4096}) == 2 * 2 * 32768 * 4096 + 2 * 2 * 4096
    assert d.min_bytes({"rows": 8, "cols": 16, "dtype": "fp32"}) == 4 * (2 * 8 * 16 + 2 * 16)
    assert d.flops({"rows": 8, "cols": 16}) == 7 * 8 * 16


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@no_gpu
def test_cuda_reduce_load_needs_gpu_and_nvcc(tmp_path):
    d = _driver(REDUCE)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU and nvcc"):
        d.load("original", str(REDUCE), "kernel.cu")
    req = _request(
        {"original": REDUCE, "candidate": REDUCE / "candidate"},
        {"c": {"rows": 64, "cols": 64}},
        tmp_path,
        rel_l2=1e-5,
        entry="kernel.cu",
    )
    with pytest.raises(RuntimeError, match="needs a CUDA GPU and nvcc"):
        drive(req, d.make_inputs, d.run, d.reference, load=d.load, extra_metrics=d.EXTRA_METRICS)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU and nvcc"):
        d.make_inputs({"rows": 4, "cols": 4}, np.random.default_rng(0), "cpu")


@needs_nvcc
def test_cuda_reduce_kernels_compile_with_ptxas_report(tmp_path, monkeypatch):
    d = _driver(REDUCE)
    monkeypatch.setattr(d, "BUILD_ROOT", tmp_path / "build")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # compiling needs no GPU
    for subject, path in (("original", REDUCE), ("candidate", REDUCE / "candidate")):
        k = d.load(subject, str(path), "kernel.cu")
        assert Path(k.so).is_file() and Path(k.so).parent.parent == tmp_path / "build"
        assert "-arch=sm_90a" in k.ptxas and "Used " in k.ptxas and "registers" in k.ptxas
        assert "0 bytes spill stores" in k.ptxas and "0 bytes stack frame" in k.ptxas
        stamp = Path(k.so).stat().st_mtime_ns
        again = d.load(subject, str(path), "kernel.cu")  # cached: same source, not rebuilt
        assert again.so == k.so and Path(k.so).stat().st_mtime_ns == stamp
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "kernel.cu").write_text('extern "C" int launch(const float* in) { return undefined_name; }\n')
    with pytest.raises(RuntimeError, match="nvcc failed"):
        d.load("broken", str(broken), "kernel.cu")
    assert "undefined_name" in (d._build_dir("broken") / "ptxas.txt").read_text()


@no_gpu
@needs_nvcc
def test_cuda_reduce_run_raises_on_launch_error(tmp_path, monkeypatch):
    d = _driver(REDUCE)
    monkeypatch.setattr(d, "BUILD_ROOT", tmp_path / "build")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    k = d.load("candidate", str(REDUCE / "candidate"), "kernel.cu")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    x, out = torch.zeros(4, 8), torch.zeros(4)
    with pytest.raises(RuntimeError, match="launch returned cudaError_t"):  # no CUDA driver here
        d.run(k, {"x": x, "out": out, "rows": 4, "cols": 8})
    assert k.launch(0, 0, -1, 8, None) == 1  # cudaErrorInvalidValue from the launcher's own check
    assert k.launch(0, 0, 0, 8, None) == 0  # nothing to do


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_layernorm_on_gpu(tmp_path):
    pytest.importorskip("triton")
    cases = {"pow2": {"rows": 256, "cols": 4096}, "odd": {"rows": 100, "cols": 1000}}
    series = _drive(
        LAYERNORM, _request(LN_SUBJECTS, cases, tmp_path, rel_l2=1e-2, entry="kernel.py", device="cuda")
    )
    for key, s in series.items():
        assert s.accuracy.passed and s.accuracy.worst_rel_l2 < 3e-3, (key, s.accuracy.detail)


@pytest.mark.gpu
@gpu
@needs_nvcc
def test_cuda_reduce_on_gpu(tmp_path, monkeypatch):
    d = _driver(REDUCE)
    monkeypatch.setattr(d, "BUILD_ROOT", tmp_path / "build")
    cases = {
        "aligned": {"rows": 1000, "cols": 4096},
        "ragged": {"rows": 333, "cols": 1001},
        "one": {"rows": 5, "cols": 1},
    }
    req = _request(
        {"original": REDUCE, "candidate": REDUCE / "candidate"},
        cases,
        tmp_path,
        rel_l2=1e-5,
        entry="kernel.cu",
        device="cuda",
    )
    res = drive(req, d.make_inputs, d.run, d.reference, load=d.load, extra_metrics=d.EXTRA_METRICS)
    assert validate_result(req, res) == [] and res.integrity == []
    for s in res.series:
        assert s.accuracy.passed, (s.subject, s.case, s.accuracy.detail)
        # the launching stream's own time ends inside the window, which adds the device synchronise
        assert len(s.stream_ns) == len(s.reps), s
        assert all(0 < t <= w * 1e6 for t, w in zip(s.stream_ns, s.samples["time"], strict=True)), s


# -- the GPU adversarial candidates whose trick needs no CUDA, through the same helper on CPU tensors ------

GPU_ADV = Path(__file__).resolve().parent / "adversarial" / "gpu"


def _drive_adversarial(name: str, tmp_path: Path, device: str = "cpu", rows: int = 32, cols: int = 256):
    """Original vs the named candidate, 12 reps each, every timed output checked; (result, {subject: series})."""
    d = _driver(LAYERNORM)
    req = _request(
        {"original": LAYERNORM, "candidate": GPU_ADV / name},
        {"c": {"rows": rows, "cols": cols}},
        tmp_path,
        rel_l2=1e-2,
        entry="kernel.py",
        reps=12,
        device=device,
    )
    res = drive(req, d.make_inputs, d.run, d.reference, extra_metrics=d.EXTRA_METRICS)
    return res, {s.subject: s for s in res.series}


@pytest.fixture
def restore_tensor_to():
    """The candidate swaps torch.Tensor.to for the whole process: put back what was there."""
    had = vars(torch.Tensor).get("to")
    yield
    if had is not None:
        torch.Tensor.to = had
    elif "to" in vars(torch.Tensor):
        del torch.Tensor.to


def test_swapped_tensor_method_is_an_integrity_violation(tmp_path, restore_tensor_to):
    """patched_tensor_method returns its input and makes every float64 conversion zeros, so output and
    reference compare equal: only the snapshot of torch.Tensor's methods sees it."""
    res, series = _drive_adversarial("patched_tensor_method", tmp_path)
    assert series["candidate"].accuracy.passed  # the trick works on the check itself ...
    assert any("torch.Tensor.to" in v for v in res.integrity), res.integrity  # ... and is caught


def test_replaced_synchronize_is_an_integrity_violation(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)  # undone after the test
    res, _ = _drive_adversarial("patched_sync", tmp_path)
    assert any("torch.cuda.synchronize" in v for v in res.integrity), res.integrity


@pytest.mark.parametrize("name", ["nan_output", "check_detector"])
def test_wrong_outputs_fail_accuracy(tmp_path, name):
    res, series = _drive_adversarial(name, tmp_path)
    assert not series["candidate"].accuracy.passed, series["candidate"].accuracy
    assert res.integrity == []


# -- the helper's CuPy clock, for drivers that use CuPy rather than torch ---------------------------------

CUPY_SUBJECT = """
import cupy


def row_sum(x, out):
    cupy.sum(x, axis=1, out=out)
    return out
"""


@pytest.mark.gpu
def test_cupy_timer_on_gpu(tmp_path):
    """A CuPy workload through the helper with timer="cupy": CuPy events around a whole-device sync."""
    cupy = pytest.importorskip("cupy")
    subject = tmp_path / "subject"
    subject.mkdir()
    (subject / "kernel.py").write_text(CUPY_SUBJECT)

    def make_inputs(case, rng, device):
        gen = cupy.random.default_rng(int(rng.integers(0, 2**63 - 1)))
        x = gen.standard_normal((case["rows"], case["cols"]), dtype=cupy.float32)
        return {"x": x, "out": cupy.empty(case["rows"], dtype=cupy.float32)}

    def run(impl, inputs):
        return impl.row_sum(inputs["x"], inputs["out"])

    def reference(case, inputs):
        return inputs["x"].astype(cupy.float64).sum(axis=1)

    req = _request(
        {"original": subject},
        {"c": {"rows": 8192, "cols": 4096}},
        tmp_path,
        rel_l2=1e-5,
        entry="kernel.py",
        device="cuda",
        reps=6,
    )
    req = req.model_copy(update={"metrics": [m for m in req.metrics if m.name == "time"]})
    res = drive(req, make_inputs, run, reference, timer="cupy")
    assert res.timing == "cupy_events+device_sync"
    assert res.integrity == [], res.integrity
    (s,) = res.series
    assert s.accuracy.passed and s.accuracy.checks == 6, s.accuracy
    assert len(s.samples["time"]) == 6 and all(0 < t < 1000 for t in s.samples["time"])


def test_unknown_timer_is_refused(tmp_path):
    req = _request(
        {"original": LAYERNORM}, {"c": {"rows": 4, "cols": 8}}, tmp_path, rel_l2=1e-2, entry="kernel.py"
    )
    d = _driver(LAYERNORM)
    with pytest.raises(ValueError, match="timer 'jax'"):
        drive(req, d.make_inputs, d.run, d.reference, extra_metrics=d.EXTRA_METRICS, timer="jax")


# Every GPU adversarial candidate through the helper on the GPU itself (bare, no container: the defences
# are the helper's; tests/gpu/test_gpu_acceptance.py runs the same candidates as full experiments).
GPU_VOIDED = {"deferred_thread", "patched_sync", "patched_tensor_method", "nan_output", "check_detector"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(p.name for p in GPU_ADV.iterdir() if (p / "kernel.py").is_file()))
def test_gpu_adversarial_candidate_through_the_helper_on_gpu(tmp_path, name, restore_tensor_to, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)  # patched_sync: put it back after
    res, series = _drive_adversarial(name, tmp_path, device="cuda", rows=8192, cols=4096)
    orig, cand = series["original"], series["candidate"]
    assert orig.accuracy.passed, orig.accuracy
    voided = bool(res.integrity) or not cand.accuracy.passed
    faster = statistics.median(cand.samples["time"]) < 0.9 * statistics.median(orig.samples["time"])
    # never both valid and faster: what the tricks were written to achieve
    assert voided or not faster, (
        name,
        res.integrity,
        cand.accuracy,
        orig.samples["time"],
        cand.samples["time"],
    )
    if name in GPU_VOIDED:
        assert voided, (name, res.integrity, cand.accuracy)
    if name == "side_stream":  # honest time through the whole-device synchronise, and a right answer
        assert not voided and not faster, (res.integrity, cand.accuracy, cand.samples["time"])
