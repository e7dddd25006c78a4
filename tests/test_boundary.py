"""The measuring boundary's parts: the supervisor's rules, the value codec, the host's cgroup freezer.

The whole boundary against hostile candidates is tests/test_adversarial.py; these pin its pieces.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from cko_perf.operations import codec
from cko_perf.operations.checktally import CheckTally
from cko_perf.operations.integrity import (
    busy_at_start_code,
    calibration_busy,
    check_bracket,
    check_post_cpu,
    check_staging,
    left_running,
    systematic_disagreement,
)
from cko_perf.operations.protocol import AccuracyRule

MS = 1_000_000


def test_bracket_confirms_an_honest_block() -> None:
    assert check_bracket(10 * MS, 500_000, 10 * MS + 500_000 + 150_000, rtt_ns=80_000) == ("", "")


def test_bracket_refuses_a_claim_longer_than_the_supervisor_saw() -> None:
    kind, why = check_bracket(12 * MS, 0, 10 * MS, rtt_ns=80_000)
    assert kind == "impossible" and "saw only" in why


def test_bracket_flags_a_clock_slowed_tenfold() -> None:
    kind, why = check_bracket(1 * MS, 100_000, 10 * MS, rtt_ns=80_000)
    assert kind == "unexplained" and "more than the worker's window" in why


def test_bracket_excuses_a_worker_that_waited_for_a_core() -> None:
    """On a loaded host the bracket can outgrow the claims while the worker sat descheduled: its cgroup's
    CPU time shows it was not working, so the sample stands."""
    kind, _ = check_bracket(10 * MS, 500_000, 16 * MS, rtt_ns=80_000, worker_cpu_ns=10 * MS + 600_000)
    assert kind == "descheduled"
    # a slowed clock: the worker was on a CPU for the whole bracket
    assert check_bracket(1 * MS, 100_000, 10 * MS, rtt_ns=80_000, worker_cpu_ns=9_800_000)[0] == "unexplained"


def test_bracket_rejects_a_non_positive_time() -> None:
    assert check_bracket(0, 0, 1 * MS, rtt_ns=1)[0] == "impossible"


def test_systematic_disagreement_needs_more_than_a_quarter() -> None:
    assert not systematic_disagreement([False] * 20)
    assert not systematic_disagreement([True] * 5 + [False] * 15)  # scheduling noise: voided, not a violation
    assert systematic_disagreement([True] * 6 + [False] * 14)
    assert not systematic_disagreement([True])  # one block alone is never "systematic"


def test_staging_bound_against_the_other_subject() -> None:
    assert check_staging(900_000, 800_000) == ""
    assert "input staging took" in check_staging(60 * MS, 800_000)


def test_post_window_cpu_bound_against_the_other_subject() -> None:
    assert check_post_cpu(1 * MS, 1 * MS) == ""
    assert "after the window" in check_post_cpu(40 * MS, 1 * MS)


def test_work_left_running_ends_the_stage_only_when_confirmed_and_unexplained() -> None:
    assert left_running(3, 0)  # three confirmed blocks, no other process on the device
    assert not left_running(2, 0)  # under the count: each block is only void
    assert not left_running(9, 1)  # another tenant's context explains a busy device
    assert not left_running(9, None)  # NVML could not count contexts: no accusation
    assert left_running(1, 0, busy_s=2.0)  # once, busy for seconds without a break: queued work
    assert not left_running(1, 0, busy_s=0.05)  # a short tail: only counted
    assert not left_running(1, 1, busy_s=60.0)  # another tenant could be what keeps it busy


def test_a_probe_calibrated_beside_running_work_is_refused_and_blamed_only_without_a_tenant() -> None:
    # the H200's figures (tests/gpu/README.md, 2026-12-03): an idle device's median, a frozen context
    # beside it, and a probe beside another context's running kernel
    assert not calibration_busy(21_000) and not calibration_busy(23_000)
    assert calibration_busy(779_000)
    # the limit a busy calibration would set (4 x p98 + 0.3 ms) is above the busy probe it must see
    assert 4 * 787_000 + 300_000 > 779_000
    assert busy_at_start_code(0) == "integrity_violation"  # only the stage's own contexts: a subject's work
    assert busy_at_start_code(1) == "device_busy"  # another process: nothing measured, nobody blamed
    assert busy_at_start_code(None) == "device_busy"


def test_the_accuracy_gate_keeps_the_first_failure_and_the_worst_errors() -> None:
    rule = AccuracyRule(rel_l2=1e-3, max_abs=0.5, check_fraction=0.01)
    t = CheckTally()
    assert t.due(rule, smoke=False)  # a series' first block is always checked
    t.add(rule, rep=0, seed=11, rel=2e-4, mx=0.1, detail="")
    assert sum(t.due(rule, smoke=False) for _ in range(2000)) < 200  # then at random, ~1 in 100
    assert t.due(rule, smoke=True)
    t.add(rule, rep=3, seed=12, rel=5e-4, mx=0.7, detail="")  # max_abs over its tolerance
    t.add(rule, rep=5, seed=13, rel=float("inf"), mx=float("nan"), detail="output refused: dtype")
    rec = t.record(rule)
    assert not rec.passed and rec.checks == 3 and rec.checked_reps == [0, 3, 5]
    assert rec.input_seeds == [11, 12, 13]
    assert rec.detail.startswith("rep 3: rel_l2 0.0005") and "max_abs 0.7" in rec.detail
    assert rec.worst_rel_l2 is None  # infinite: not a number a record can carry
    assert rec.tolerance == {"rel_l2": 1e-3, "max_abs": 0.5}
    ok = CheckTally()
    ok.add(rule, rep=0, seed=1, rel=1e-3, mx=0.5, detail="")  # on the tolerance passes
    assert ok.record(rule).passed and ok.record(rule).worst_rel_l2 == 1e-3


# -- codec -------------------------------------------------------------------------------------


def test_codec_round_trip_keeps_structure_and_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    value = {
        "x": rng.standard_normal((7, 5)),
        "n": 3,
        "eps": 1e-5,
        "name": "c",
        "none": None,
        "pair": (np.arange(4, dtype=np.int32), [np.float32(2.5), True]),
    }
    codec.encode(value, tmp_path)
    back = codec.decode(tmp_path, max_bytes=1 << 20)
    assert back["n"] == 3 and back["eps"] == 1e-5 and back["name"] == "c" and back["none"] is None
    np.testing.assert_array_equal(back["x"], value["x"])
    assert isinstance(back["pair"], tuple) and back["pair"][0].dtype == np.int32
    assert back["pair"][1] == [2.5, True]


def test_decoded_arrays_are_private_copies_on_write(tmp_path: Path) -> None:
    codec.encode({"x": np.ones((4, 4))}, tmp_path)
    a = codec.decode(tmp_path, max_bytes=1 << 20)["x"]
    a[...] = -7.0  # an in-place subject destroys its copy ...
    b = codec.decode(tmp_path, max_bytes=1 << 20)["x"]
    assert (b == 1.0).all()  # ... and the file, the supervisor's, is untouched


def test_codec_round_trips_torch_bfloat16(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 8).to(torch.bfloat16)
    codec.encode({"t": t}, tmp_path)
    back = codec.decode(tmp_path, max_bytes=1 << 20, device_ok=False)["t"]
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)


def test_codec_refuses_a_torch_dtype_numpy_has_no_name_for(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    q = torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)
    with pytest.raises(codec.CodecError, match="qint8"):
        codec.encode({"q": q}, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int64", "bool", "float8_e4m3fn"])
def test_codec_writes_a_device_tensor_straight_into_the_file(
    tmp_path: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's Fetch: CUDA tensors (strided, of each kind, one in pieces of the page-locked
    stage, several through the one reused stage) written as `.npy`, read back by the supervisor's
    decoder bit for bit."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    base = torch.randn(64, 96, device="cuda") * 4
    t, again = ((b > 0 if dtype == "bool" else b.to(getattr(torch, dtype))).t() for b in (base, -base))
    monkeypatch.setattr(codec, "STAGE_BYTES", 1 << 20)
    big = torch.randn(1024, 1100, device="cuda")  # 4.5 MB: five pieces through a 1 MiB stage
    codec.encode({"t": t, "empty": t[:0], "big": big, "again": again}, tmp_path, host_only=True)
    back = codec.decode(tmp_path, max_bytes=1 << 24, device_ok=True)
    assert back["t"].device.type == "cpu" and back["t"].dtype == t.dtype and back["t"].shape == t.shape
    assert torch.equal(back["t"].view(torch.uint8), t.cpu().contiguous().view(torch.uint8))
    assert torch.equal(back["again"].view(torch.uint8), again.cpu().contiguous().view(torch.uint8))
    assert torch.equal(back["big"], big.cpu())
    assert back["empty"].shape == t[:0].shape


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "bool", "int64"])
def test_a_tensor_crosses_in_pieces_of_the_stage_and_reads_back_bit_for_bit(
    tmp_path: Path, dtype: str
) -> None:
    """The worker's `.npy` writer, its pieces forced small (on a host tensor it copies each piece
    pageable, the path it falls back to where page-locked memory cannot be had)."""
    torch = pytest.importorskip("torch")
    base = torch.randn(37, 53) * 4
    t = (base > 0 if dtype == "bool" else base.to(getattr(torch, dtype))).t()  # strided: 53x37
    view, _ = codec._torch_host_view(t)
    codec._write_npy(view, tmp_path / "a.npy", codec._numpy_dtype(view), stage_bytes=1000)
    back = np.load(tmp_path / "a.npy", allow_pickle=False)
    assert back.shape == (53, 37)
    assert back.tobytes() == view.contiguous().numpy().tobytes()
    with pytest.raises(codec.CodecError, match="cannot be written"):
        codec._write_npy(view, tmp_path / "b.npy", np.dtype("complex128"))


def _manifest(tmp_path: Path, root: object) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"root": root}))


@pytest.mark.parametrize(
    "node,why",
    [
        ({"a": "../../etc/passwd", "dtype": "<f8", "shape": [1]}, "refused"),
        ({"a": "a0001.npy", "dtype": "|O", "shape": [1]}, "refused"),
        ({"a": "a0001.npy", "dtype": "<f8", "shape": [1000, 1000]}, "does not hold"),
        ({"a": "a0001.npy", "dtype": "<f8", "shape": [-1]}, "negative"),
        ({"x": 1}, "malformed"),
    ],
)
def test_codec_refuses_hostile_manifests(tmp_path: Path, node: dict, why: str) -> None:
    np.save(tmp_path / "a0001.npy", np.zeros(4))
    _manifest(tmp_path, node)
    with pytest.raises(codec.CodecError, match=why):
        codec.decode(tmp_path, max_bytes=1 << 30)


def test_codec_refuses_more_than_its_budget_and_deep_nesting(tmp_path: Path) -> None:
    codec.encode({"x": np.zeros(1024)}, tmp_path)
    with pytest.raises(codec.CodecError, match="larger than the size allowed"):
        codec.decode(tmp_path, max_bytes=100)
    deep: dict = {"s": 1}
    for _ in range(40):
        deep = {"l": [deep]}
    _manifest(tmp_path, deep)
    with pytest.raises(codec.CodecError):
        codec.decode(tmp_path, max_bytes=1 << 20)


def test_codec_refuses_a_symlinked_array(tmp_path: Path) -> None:
    np.save(tmp_path / "real.npy", np.zeros(4))
    os.symlink(tmp_path / "real.npy", tmp_path / "a0001.npy")
    _manifest(tmp_path, {"a": "a0001.npy", "dtype": "<f8", "shape": [4]})
    with pytest.raises(codec.CodecError):
        codec.decode(tmp_path, max_bytes=1 << 20)


def test_codec_refuses_objects_it_cannot_pass(tmp_path: Path) -> None:
    with pytest.raises(codec.CodecError, match="cannot pass"):
        codec.encode({"f": lambda: 1}, tmp_path)


# -- the freezer, on real containers ------------------------------------------------------------

BURN_WITH_DETACHED_CHILD = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        while True: pass\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "while True: pass\n"
)


@pytest.mark.docker
def test_freezer_stops_a_containers_whole_tree_detached_children_included() -> None:
    from cko_perf.runner import images, sandbox
    from cko_perf.runner.freezer import Cgroup

    client = images.docker_client()
    spec = sandbox.ContainerSpec(
        image_id=images.resolve("cpu", client).image_id,
        command=["/opt/cko/bin/python", "-c", BURN_WITH_DETACHED_CHILD],
        limits=sandbox.default_limits().model_copy(update={"memory_bytes": 256 << 20, "pids": 64}),
        labels={f"{sandbox.LABEL}.test": "freezer"},
    )
    c = client.containers.create(**sandbox.container_kwargs(spec))
    try:
        c.start()
        c.reload()
        cg = Cgroup.of_pid(int(c.attrs["State"]["Pid"]))
        time.sleep(0.5)
        assert cg.usage_ns() > 0
        cg.set_frozen(True)
        assert cg.frozen()
        u0 = cg.usage_ns()
        time.sleep(0.4)
        assert cg.usage_ns() == u0  # nothing of the tree ran, the detached grandchild included
        cg.set_frozen(False)
        time.sleep(0.3)
        assert cg.usage_ns() > u0 + 50_000_000  # both busy loops run again (1 CPU allowed)
    finally:
        try:
            Cgroup.of_pid(int(c.attrs["State"]["Pid"])).set_frozen(False)
        except Exception:
            pass
        sandbox.remove_container(client, c.id, grace=1, bound=20)


def test_thread_pools_are_sized_to_the_containers_cpu_quota_unless_the_request_says() -> None:
    """More OpenMP/BLAS threads than the quota get the container throttled mid-block (torch on CPU
    tripped the bracket check that way); the quota, not the host's cores, sizes them."""
    from cko_perf.runner import sandbox

    lim = sandbox.default_limits().model_copy(update={"cpus": 3.5})
    env = sandbox.container_kwargs(sandbox.ContainerSpec(image_id="sha256:x", command=["true"], limits=lim))[
        "environment"
    ]
    assert [env[v] for v in sandbox.THREAD_POOL_VARS] == ["3", "3", "3"]
    own = sandbox.ContainerSpec(
        image_id="sha256:x", command=["true"], limits=lim, env={"OMP_NUM_THREADS": "8"}
    )
    assert sandbox.container_kwargs(own)["environment"]["OMP_NUM_THREADS"] == "8"
