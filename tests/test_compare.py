"""operations.compare: the accuracy gate's arithmetic. The NumPy and torch paths must give the same
quantities whatever mix of host arrays, host tensors and device tensors reaches them (the supervisor
compares an output passed back as a host array with a reference the harness may keep on its GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from cko_perf.operations.compare import compare

torch = pytest.importorskip("torch")


def _pair(seed: int = 0, n: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(n)
    out = ref + 1e-3 * rng.standard_normal(n)
    return out, ref


def _by_hand(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = out.astype(np.float64) - ref.astype(np.float64)
    return float(np.sqrt((d * d).sum() / (ref * ref).sum())), float(np.abs(d).max())


def test_numpy_path_matches_the_definition() -> None:
    out, ref = _pair()
    rel, mx, detail = compare(out, ref)
    want = _by_hand(out, ref)
    assert detail == ""
    assert rel == pytest.approx(want[0], rel=1e-12) and mx == pytest.approx(want[1], rel=1e-12)


def test_numpy_output_against_a_torch_reference_gives_the_same_figures() -> None:
    out, ref = _pair(1)
    a = compare(out.astype(np.float32), ref)
    b = compare(out.astype(np.float32), torch.from_numpy(ref))
    c = compare(torch.from_numpy(out.astype(np.float32)), torch.from_numpy(ref))
    assert a[2] == b[2] == c[2] == ""
    assert b[0] == pytest.approx(a[0], rel=1e-12) and c[0] == pytest.approx(a[0], rel=1e-12)
    assert b[1] == pytest.approx(a[1], rel=1e-12) and c[1] == pytest.approx(a[1], rel=1e-12)


def test_bf16_output_is_widened_not_truncated() -> None:
    """A bf16 output (as passed back: a host tensor) against a float64 reference: the error is bf16's
    rounding (~0.4% relative), computed in float64."""
    ref = torch.linspace(-3, 3, 10_001, dtype=torch.float64)
    rel, mx, detail = compare(ref.to(torch.bfloat16), ref)
    assert detail == ""
    assert 1e-4 < rel < 5e-3 and 0 < mx <= 3 * 2**-8


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_output_fails_on_both_paths(bad: float) -> None:
    out, ref = _pair(2)
    out[17] = bad
    for o, r in ((out, ref), (out, torch.from_numpy(ref)), (torch.from_numpy(out), torch.from_numpy(ref))):
        rel, mx, detail = compare(o, r)
        assert rel == mx == float("inf") and "non-finite" in detail


def test_shape_mismatch_fails_on_both_paths() -> None:
    out, ref = _pair(3)
    for o, r in ((out[:-1], ref), (out[:-1], torch.from_numpy(ref))):
        rel, _, detail = compare(o, r)
        assert rel == float("inf") and "shape" in detail


@pytest.mark.gpu
def test_host_output_against_a_device_reference_is_compared_on_the_device() -> None:
    """The supervisor's case: the output passed back (host) and the harness's reference on the GPU.
    Same figures as on the host."""
    out, ref = _pair(4, 1 << 20)
    host = compare(torch.from_numpy(out).to(torch.bfloat16), torch.from_numpy(ref))
    dev = compare(torch.from_numpy(out).to(torch.bfloat16), torch.from_numpy(ref).cuda())
    assert host[2] == dev[2] == ""
    assert dev[0] == pytest.approx(host[0], rel=1e-9) and dev[1] == pytest.approx(host[1], rel=1e-9)
