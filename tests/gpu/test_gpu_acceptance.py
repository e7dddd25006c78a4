"""GPU acceptance through the CLI (marked gpu: skipped where no NVIDIA GPU is present).

Run on a GPU machine after `source tests/gpu/prepare.sh` and the cuda image build
(tests/gpu/README.md): `python3 -m pytest -q -m gpu tests/gpu`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, adversarial_target, run_candidate, run_cko

pytestmark = [pytest.mark.gpu, pytest.mark.docker]


def test_doctor_sees_the_gpu_and_a_usable_passthrough() -> None:
    d = run_cko("doctor", "--json").json
    assert d["gpu"]["available"] is True
    assert d["gpu"]["devices"][0]["uuid"].startswith("GPU-")
    assert any(m["usable"] for m in d["passthrough"] if m["mode"] != "none")


def test_container_sees_exactly_the_granted_gpu(store: Path) -> None:
    r = run_cko("exec", "--image", "cuda", "--gpus", "0", "--json", "--", "nvidia-smi", "-L", store=store)
    assert r.code == 0, r.stdout
    uuid = r.json["identity"]["devices"][0]["uuid"]
    assert uuid in r.json["stdout_tail"] and r.json["stdout_tail"].count("GPU ") == 1
    assert r.json["probe"]["gpus"]["uuids"] == [uuid]


@pytest.mark.parametrize("example", ["torch-layernorm", "cuda-reduce"])
def test_loop_on_gpu_example(example: str, store: Path) -> None:
    ex = ROOT / "examples" / example
    r = run_cko("readiness", "--request", str(ex / "readiness.json"), "--json", store=store, timeout=900)
    assert r.code == 0, r.stdout
    tgt = r.json["target"]["id"]
    assert r.json["identity"]["driver_version"].startswith("580")
    assert (
        run_cko(
            "baseline",
            "--request",
            str(ex / "baseline.json"),
            "--target",
            tgt,
            "--json",
            store=store,
            timeout=900,
        ).code
        == 0
    )
    v = run_cko("variant", "--request", str(ex / "variant.json"), "--target", tgt, "--json", store=store).json
    t = run_cko(
        "experiment",
        "--request",
        str(ex / "target.json"),
        "--target",
        tgt,
        "--variant",
        v["variant"]["id"],
        "--json",
        store=store,
        timeout=900,
    )
    assert t.code == 0, t.stdout
    assert t.json["stage_outcome"] == "accepted", json.dumps(t.json)[:2000]
    sel = run_cko("champion", "select", "--experiment", t.json["experiment"]["id"], "--json", store=store)
    assert sel.code == 0, sel.stdout
    a = run_cko(
        "audit", "--json", store=store, timeout=900
    )  # re-runs original vs champion in the pinned image
    assert a.code == 0 and a.json["holds"] is True, a.stdout[-3000:]
    ver = run_cko("verify", "--json", store=store)
    assert ver.code == 0 and ver.json["ok"] is True, ver.stdout[-2000:]


@pytest.mark.parametrize("variant", ["variant.json", "variant-compile.json"])
def test_triton_and_torch_compile_candidates_reach_a_target_verdict(variant: str, tmp_path: Path) -> None:
    """Each candidate in its own warm worker: Triton's JIT and Inductor's compile happen in the warm-up,
    their idle helper threads are frozen between windows, and the target stage decides."""
    ex = ROOT / "examples" / "torch-layernorm"
    store = tmp_path / "store"
    r = run_cko("readiness", "--request", str(ex / "readiness.json"), "--json", store=store, timeout=900)
    assert r.code == 0, r.stdout
    tgt = r.json["target"]["id"]
    v = run_cko("variant", "--request", str(ex / variant), "--target", tgt, "--json", store=store)
    assert v.code == 0, v.stdout
    t = run_cko(
        "experiment",
        "--request",
        str(ex / "target.json"),
        "--target",
        tgt,
        "--variant",
        v.json["variant"]["id"],
        "--json",
        store=store,
        timeout=900,
    )
    assert t.code == 0, t.stdout[-3000:]
    assert t.json["stage_outcome"] == "accepted", json.dumps(t.json)[:3000]
    assert t.json["cases"][0]["effect_pct"] > 50


def test_ncu_collect_on_the_cuda_example(store: Path, tmp_path: Path) -> None:
    """`cko profile ncu --collect`: the driver under ncu in the sandbox, its CSV parsed into launches."""
    ex = ROOT / "examples" / "cuda-reduce"
    r = run_cko("readiness", "--request", str(ex / "readiness.json"), "--json", store=store, timeout=900)
    assert r.code == 0, r.stdout
    (tmp_path / "policy.yaml").write_text("max_timeout_s: 3600\n")  # counters as the non-root user (issue 20)
    (tmp_path / "collect.json").write_text(json.dumps({"subject": "original", "reps": 1}))
    c = run_cko(
        "profile",
        "ncu",
        "--collect",
        "--request",
        str(tmp_path / "collect.json"),
        "--target",
        r.json["target"]["id"],
        "--policy",
        str(tmp_path / "policy.yaml"),
        "--json",
        store=store,
        timeout=900,
    )
    assert c.code == 0, c.stdout[-3000:]
    assert c.json.get("limitation") is None and c.json["facts"].get("limitation") is None, c.json
    rows = [la for la in c.json["facts"]["launches"] if "row_sum" in la["name"]]
    assert rows, [la["name"] for la in c.json["facts"]["launches"]]
    assert all(la["duration_ns"] and la["duration_ns"] > 0 and la["registers_per_thread"] for la in rows), (
        rows
    )
    assert all(la["dram_throughput_pct"] is not None for la in rows), rows


def test_sass_binary_of_the_cuda_candidate(store: Path, tmp_path: Path) -> None:
    """`cko sass --binary` (cuobjdump in the cuda image) on the candidate built for sm_90a: 16-byte loads."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).is_file():
        pytest.skip("no nvcc on this host to build the cubin")
    cubin = tmp_path / "candidate.cubin"
    subprocess.run(
        [
            nvcc,
            "-arch=sm_90a",
            "-cubin",
            "-o",
            str(cubin),
            str(ROOT / "examples" / "cuda-reduce" / "candidate" / "kernel.cu"),
        ],
        check=True,
        timeout=300,
    )
    r = run_cko("sass", "--binary", str(cubin), "--json", store=store, timeout=600)
    assert r.code == 0, r.stdout[-3000:]
    fns = r.json["facts"]["sass"]["functions"]
    assert fns and all(f["arch"] and "90" in f["arch"] for f in fns), fns
    assert any(f["global_load_widths"].get("16") for f in fns), [f["global_load_widths"] for f in fns]


GPU_ADV = ROOT / "tests" / "adversarial" / "gpu"
GPU_CANDIDATES = sorted(p.name for p in GPU_ADV.iterdir() if (p / "kernel.py").is_file())
# What each must end in. The subject runs in its own worker (own container, uid, CUDA context), frozen
# outside its windows; "honest" ones do the original's work with a trick aimed at the harness or the
# clock that the boundary leaves without effect: an unaccepted comparison of equal code.
HONEST = ("below_minimum", "inconclusive", "regressed")
GPU_EXPECTED = {
    # the worker's window ends with a whole-device synchronise: honest time; on a slower H100 host
    # (2026-12-06) 5 of its 16 blocks took longer on the supervisor's clock than its claims explain,
    # which the bracket rule calls what it is (work outside the window): unaccepted either way
    "side_stream": (*HONEST, "integrity_violation"),
    # the worker's clock bound synchronize before the subject loaded; the worker's snapshot of torch's
    # callables sees the swap after the run (the candidate's docstring): either leaves it unaccepted
    "patched_sync": (*HONEST, "integrity_violation"),
    # its thread's work, when it lands after the window, is seen by the idle probes (void) or read
    # unwritten (accuracy); when the thread gets its turn inside the window, the window's device-wide
    # synchronise times it, and it is the eager code it is: an honest, unaccepted outcome
    "deferred_thread": ("failed_accuracy", "integrity_violation", *HONEST),
    # busy before the first block, with every worker frozen: the probe's calibration refuses it
    "queue_flood": ("integrity_violation",),
    # busy after its warm-up with it frozen, for seconds without a break: the left-running stop at once
    # (or void blocks and the stop after three commands, where the backlog is shorter)
    "queue_flood_late": ("inconclusive", "integrity_violation"),
    # bursts of ~1 s that drain before the next: never 2 s busy without a break, but each probe after
    # its commands finds the device busy with it frozen (void blocks, the stop after three commands);
    # a burst queued inside its own window only makes it slower
    "queue_flood_bursts": ("inconclusive", "integrity_violation", "regressed"),
    "forged_time": ("integrity_violation",),
    # the supervisor evicts L2 itself, from its own context, between the staging and the window: the
    # no-op flush skips nothing, and the re-read of its inputs before the window is its own GPU time
    # in the bracket the clock rules hold against the reference's
    "skip_flush": (*HONEST, "void"),
    "cache_by_ptr": ("failed_accuracy",),
    # the check runs in the supervisor's process (its output is its input: wrong), and the worker's
    # own snapshot of torch.Tensor's methods sees the swap (the candidate's docstring): either voids
    "patched_tensor_method": ("failed_accuracy", "integrity_violation"),
    "input_overwrite": ("failed_accuracy",),
    "nan_output": ("failed_accuracy",),
    "check_detector": ("failed_accuracy",),
}


@pytest.fixture(scope="module")
def layernorm_target(tmp_path_factory: pytest.TempPathFactory) -> dict:
    case = {"id": "bf16_8192x4096", "params": {"rows": 8192, "cols": 4096, "dtype": "bf16"}}
    return adversarial_target(
        ROOT / "examples" / "torch-layernorm", tmp_path_factory.mktemp("gpu-adv"), case, warmup=5
    )


def test_every_gpu_candidate_has_an_expectation() -> None:
    assert set(GPU_CANDIDATES) == set(GPU_EXPECTED)


@pytest.mark.parametrize("name", GPU_CANDIDATES)
def test_gpu_adversarial_candidate_is_never_accepted(layernorm_target: dict, name: str) -> None:
    walls: dict = {}
    r, doc = run_candidate(layernorm_target, GPU_ADV / name, name, walls)
    keep = os.environ.get("CKO_GPU_EVIDENCE_DIR")
    if keep:  # acceptance.sh: each outcome on disk as it comes (a call cut short still has them)
        Path(keep, f"adversarial-{name}.json").write_text(json.dumps(doc | {"_walls_s": walls}, indent=1))
    assert doc.get("stage_outcome") != "accepted" and doc.get("primary_verdict") != "accepted", json.dumps(
        doc
    )[:3000]
    got = (
        doc.get("stage_outcome")
        if doc.get("stage_outcome") in ("integrity_violation", "failed_accuracy")
        else doc.get("primary_verdict")
    )
    assert got in GPU_EXPECTED[name], json.dumps(doc)[:3000]


@pytest.fixture(scope="module")
def graph_target(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """torch-layernorm on a us-scale case, timed in graph mode (sized at readiness)."""
    work = tmp_path_factory.mktemp("graph") / "torch-layernorm"
    shutil.copytree(ROOT / "examples" / "torch-layernorm", work, ignore=shutil.ignore_patterns("__pycache__"))
    req = json.loads((work / "readiness.json").read_text())
    req["cases"] = [{"id": "bf16_4096x1024", "params": {"rows": 4096, "cols": 1024, "dtype": "bf16"}}]
    req["accuracy"]["check_fraction"] = 0.5
    req["plan"].update({"timing": {"mode": "graph"}, "target_pairs": 16})
    (work / "readiness.json").write_text(json.dumps(req))
    store = work.parent / "store"
    r = run_cko("readiness", "--request", str(work / "readiness.json"), "--json", store=store, timeout=900)
    assert r.code == 0, r.stdout[-3000:]
    tid = r.json["target"]["id"]
    timing = json.loads((store / "targets" / f"{tid}.json").read_text())["plan"]["timing"]
    assert timing["mode"] == "graph" and timing["runs_per_block"] > 1, timing
    return {"work": work, "store": store, "id": tid}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (ROOT / "examples" / "torch-layernorm" / "candidate", ("accepted",)),
        (GPU_ADV / "cache_by_ptr", ("failed_accuracy",)),  # a capture of nothing: its decoy's answer
    ],
    ids=["triton", "cache_by_ptr"],
)
def test_graph_mode_times_replays_and_checks_them_on_the_blocks_inputs(
    graph_target: dict, path: Path, expected: tuple[str, ...]
) -> None:
    r, doc = run_candidate(graph_target, path, f"graph-{path.name}")
    assert doc.get("stage_outcome") in expected, json.dumps(doc)[:3000]
    if expected == ("accepted",):
        from tests.test_adversarial import measured

        series = measured(graph_target["store"], doc)["series"]
        assert {s["timing_mode"] for s in series} == {"graph"}
        assert all(len(s["capture_ns"]) == len(s["reps"]) and min(s["capture_ns"]) > 0 for s in series)
