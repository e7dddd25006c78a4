"""graph mode's worker side, in milliseconds, without a GPU: the refill of captured buffers and the
refusals a subject or a clock that cannot be captured gets (the capture itself runs on the H200:
tests/gpu/test_gpu_acceptance.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cko_perf.operations.protocol import (
    PROTOCOL,
    AccuracyRule,
    Case,
    DriverRequest,
    Metric,
    ScheduleItem,
    Subject,
    WorkerSlot,
)
from cko_perf.operations.refill import RefillError, refill
from cko_perf.operations.timing import Backend
from cko_perf.operations.wire import Capture, Drop, Run
from cko_perf.operations.worker import Worker


def test_refill_writes_every_buffer_in_place() -> None:
    rng = np.random.default_rng(1)
    dst = {"x": np.zeros((4, 8)), "pair": [np.zeros(3), np.zeros(3)], "eps": 1e-5}
    keep = (dst["x"], dst["pair"][0])
    src = {
        "x": rng.standard_normal((4, 8)),
        "pair": [rng.standard_normal(3), rng.standard_normal(3)],
        "eps": 1e-5,
    }
    refill(dst, src)
    assert dst["x"] is keep[0] and dst["pair"][0] is keep[1]  # the captured addresses stay
    assert np.array_equal(dst["x"], src["x"]) and np.array_equal(dst["pair"][1], src["pair"][1])


@pytest.mark.parametrize(
    ("src", "where"),
    [
        ({"x": np.zeros((4, 9)), "eps": 1e-5}, "inputs['x']"),
        ({"x": np.zeros((4, 8), dtype=np.float32), "eps": 1e-5}, "inputs['x']"),
        ({"x": np.zeros((4, 8)), "eps": 1e-3}, "inputs['eps']"),
        ({"x": np.zeros((4, 8))}, "inputs: keys"),
    ],
    ids=["shape", "dtype", "plain value", "keys"],
)
def test_refill_refuses_inputs_that_do_not_fit_the_captured_buffers(src: dict, where: str) -> None:
    dst = {"x": np.ones((4, 8)), "eps": 1e-5}
    with pytest.raises(RefillError, match=where.replace("[", r"\[").replace("]", r"\]")):
        refill(dst, src)


def _worker() -> Worker:
    return Worker(
        run=lambda impl, inputs: inputs["x"] * 2,
        make_inputs=lambda params, rng, device: {"x": rng.standard_normal(4)},
        impl=None,
        backend=Backend(),
        device="cpu",
    )


def test_a_clock_without_graphs_refuses_the_capture_with_the_reason() -> None:
    reply = _worker().handle(Capture(case="c", params={}, seed=3, runs=4))
    assert reply is not None and not reply.ok and "graph mode needs CUDA" in (reply.error or "")


def test_a_graph_run_without_its_capture_is_refused() -> None:
    reply = _worker().handle(Run(case="c", params={}, rep=0, seeds=[3], mode="graph"))
    assert reply is not None and not reply.ok and "Capture must come first" in (reply.error or "")


def test_the_protocol_refuses_graph_mode_off_cuda_or_without_workers() -> None:
    base = {
        "protocol": PROTOCOL,
        "mode": "measure",
        "subjects": [Subject(id="a", path="/a")],
        "cases": [Case(id="c", params={})],
        "schedule": [ScheduleItem(subject="a", case="c", rep=0)],
        "metrics": [Metric(name="time", unit="ms")],
        "accuracy": AccuracyRule(rel_l2=1e-3),
        "seed": 0,
        "result_path": "/tmp/r",
        "timing_mode": "graph",
    }
    with pytest.raises(ValueError, match="timing_mode graph needs device cuda"):
        DriverRequest(**base, device="cpu", workers=[WorkerSlot(subject="a", uid=61000, gid=61000)])
    with pytest.raises(ValueError, match="the worker boundary"):
        DriverRequest(**base, device="cuda")
    ok = DriverRequest(**base, device="cuda", workers=[WorkerSlot(subject="a", uid=61000, gid=61000)])
    assert ok.timing_mode == "graph"


def test_no_collection_runs_inside_a_run_command_it_waits_for_the_release() -> None:
    """A window that makes many Python objects (a torch.compile call does) must not set the collector
    off inside its Run command, outside the claimed window: it runs in the Drop that follows."""
    import gc

    seen: list[str] = []
    w = Worker(
        run=lambda impl, inputs: [[i] for i in range(20_000)],  # far above the collector's threshold
        make_inputs=lambda params, rng, device: {"x": rng.standard_normal(4)},
        impl=None,
        backend=Backend(),
        device="cpu",
    )
    cmd = Run(case="c", params={}, rep=0, seeds=[3, 4, 5], mode="hot")

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(current[0])

    current = ["run"]
    gc.callbacks.append(note)
    try:
        reply = w.handle(cmd)
        assert reply is not None and reply.ok and reply.t_ns
        assert not gc.isenabled()
        current[0] = "drop"
        assert w.handle(Drop()) is not None
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(note)
        gc.enable()
    assert "run" not in seen and "drop" in seen, seen


def test_every_run_of_a_block_gets_inputs_of_its_own_and_any_run_can_be_fetched(tmp_path) -> None:
    """A subject that remembers its answer per input object computes every run of a block: no two
    runs share inputs, and the output fetched is the drawn run's, not the last one's."""
    from cko_perf.operations import codec
    from cko_perf.operations.wire import Fetch

    seen: list[int] = []

    def run(impl: object, inputs: dict) -> np.ndarray:
        seen.append(id(inputs["x"]))
        return inputs["x"] * 2

    w = Worker(run=run, make_inputs=_worker().make_inputs, impl=None, backend=Backend(), device="cpu")
    seeds = [11, 12, 13, 14]
    reply = w.handle(Run(case="c", params={}, rep=0, seeds=seeds, mode="hot"))
    assert reply is not None and reply.ok and len(set(seen)) == len(seeds)
    out = tmp_path / "o"
    out.mkdir()
    assert w.handle(Fetch(out=str(out), run=2)) is not None
    want = np.random.default_rng(13).standard_normal(4) * 2
    np.testing.assert_array_equal(codec.decode(out, max_bytes=1 << 20, device_ok=False), want)


def test_a_fetch_of_a_run_the_block_did_not_have_is_refused(tmp_path) -> None:
    from cko_perf.operations.wire import Fetch

    w = _worker()
    assert w.handle(Run(case="c", params={}, rep=0, seeds=[1, 2], mode="hot")).ok  # type: ignore[union-attr]
    reply = w.handle(Fetch(out=str(tmp_path), run=2))
    assert reply is not None and not reply.ok and "no run 2" in (reply.error or "")


def test_a_run_with_a_directory_count_unlike_its_seeds_is_refused() -> None:
    with pytest.raises(ValueError, match="inputs: 1 directories for 2 runs"):
        Run(case="c", params={}, rep=0, seeds=[1, 2], inputs=["/a"], mode="hot")


class _CountingFlush(Backend):
    """The CPU clock, counting the L2 flushes the worker's own code asks for."""

    def __init__(self) -> None:
        self.flushes = 0

    def flush_l2(self) -> None:
        self.flushes += 1


def test_a_cold_block_the_supervisor_flushes_is_staged_held_and_timed_only_on_go(tmp_path) -> None:
    """flush "supervisor": the Run stages and answers without a window (nor the worker's flush, which a
    subject could make a no-op); the Go opens it on what was staged, and the output is fetchable."""
    from cko_perf.operations import codec
    from cko_perf.operations.wire import Fetch, Go

    backend = _CountingFlush()
    w = Worker(
        run=_worker().run_fn, make_inputs=_worker().make_inputs, impl=None, backend=backend, device="cpu"
    )
    staged = w.handle(Run(case="c", params={}, rep=0, seeds=[7], mode="cold", flush="supervisor"))
    assert staged is not None and staged.ok and staged.t_ns is None and staged.stage_ns is not None
    timed = w.handle(Go())
    assert timed is not None and timed.ok and (timed.t_ns or 0) > 0 and timed.stage_ns == staged.stage_ns
    assert backend.flushes == 0
    out = tmp_path / "o"
    out.mkdir()
    assert w.handle(Fetch(out=str(out), run=0)).ok  # type: ignore[union-attr]
    want = np.random.default_rng(7).standard_normal(4) * 2
    np.testing.assert_array_equal(codec.decode(out, max_bytes=1 << 20, device_ok=False), want)
    again = w.handle(Go())  # the held block was timed once; a second Go has nothing to time
    assert again is not None and not again.ok and "no staged block" in (again.error or "")


def test_a_cold_block_the_worker_flushes_is_timed_at_once_after_its_flush() -> None:
    backend = _CountingFlush()
    w = Worker(
        run=_worker().run_fn, make_inputs=_worker().make_inputs, impl=None, backend=backend, device="cpu"
    )
    reply = w.handle(Run(case="c", params={}, rep=0, seeds=[7], mode="cold"))
    assert reply is not None and reply.ok and (reply.t_ns or 0) > 0 and backend.flushes == 1


def test_a_drop_forgets_a_held_block() -> None:
    from cko_perf.operations.wire import Go

    w = _worker()
    assert w.handle(Run(case="c", params={}, rep=0, seeds=[7], mode="cold", flush="supervisor")).ok  # type: ignore[union-attr]
    assert w.handle(Drop()).ok  # type: ignore[union-attr]
    reply = w.handle(Go())
    assert reply is not None and not reply.ok and "no staged block" in (reply.error or "")
