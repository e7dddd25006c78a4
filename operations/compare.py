"""Comparing a subject's output with the harness's reference, where the harness runs.

Used by the supervisor (outputs passed back from a worker, always host arrays) and by the
harness-trusted path (outputs and references where they live).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# NumPy dtypes torch.from_numpy takes and widens to float64 on every device
TORCH_READS = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"))


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor: bf16/fp16 through float32
        t = x.detach()
        if t.dtype.is_floating_point and t.element_size() < 4:
            t = t.float()
        return np.asarray(t.cpu().numpy())
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        return np.asarray(x.get())
    return np.asarray(x)


def compare(output: Any, expected: Any) -> tuple[float, float, str]:
    """(relative L2 error, max abs error, detail). Non-finite output or shape mismatch → inf.

    Against a torch reference the comparison runs in float64 on the reference's device (on a GPU that
    is milliseconds where copying a gigabyte to the host and reducing it with NumPy took seconds per
    check); a NumPy output of a real or integer dtype joins it there. Anything else goes through
    NumPy. Both paths compute the same quantities.
    """
    if output is None:
        return float("inf"), float("inf"), "run returned no output"
    if hasattr(expected, "detach") and isinstance(output, np.ndarray) and output.dtype.name in TORCH_READS:
        import torch

        output = torch.from_numpy(np.ascontiguousarray(output))
    if hasattr(output, "detach") and hasattr(expected, "detach"):
        return _compare_torch(output, expected)
    out = to_numpy(output).astype(np.float64, copy=False)
    ref = to_numpy(expected).astype(np.float64, copy=False)
    if out.shape != ref.shape:
        return float("inf"), float("inf"), f"shape {out.shape} != reference {ref.shape}"
    finite = np.isfinite(out)
    if not finite.all():
        return (
            float("inf"),
            float("inf"),
            f"{int((~finite).sum())} non-finite output element(s) (NaN/Inf or unwritten)",
        )
    diff = out - ref
    denom = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(diff)) / (denom if denom > 0 else 1.0)
    return rel, float(np.max(np.abs(diff))) if diff.size else 0.0, ""


def _compare_torch(output: Any, expected: Any) -> tuple[float, float, str]:
    import torch

    out = output.detach()
    ref = expected.detach()
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf"), float("inf"), f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if out.is_complex() or ref.is_complex():  # NumPy's path handles complex values as they are
        return compare(to_numpy(out), to_numpy(ref))
    # On the reference's device: a reference the harness made on a GPU stays there and the output (as
    # passed back, in its own dtype) goes to it, where the float64 passes take milliseconds; on the
    # host they took ~0.3 s per check of 16M elements (LayerNorm 4096x4096 on the H100), most of a
    # target stage's loop.
    # Moved in its own dtype, widened where the reference is: torch converts a host-to-device copy's
    # dtype on the host, which for a 16M-element bf16 output meant a 128 MB float64 array made by one CPU
    # thread and copied over (~34 ms per check on the H100).
    out = out.to(ref.device).to(torch.float64)
    ref = ref.to(torch.float64)
    bad = int((~torch.isfinite(out)).sum().item())
    if bad:
        return float("inf"), float("inf"), f"{bad} non-finite output element(s) (NaN/Inf or unwritten)"
    if out.numel() == 0:
        return 0.0, 0.0, ""
    diff = out - ref
    denom = float(torch.linalg.vector_norm(ref).item())
    rel = float(torch.linalg.vector_norm(diff).item()) / (denom if denom > 0 else 1.0)
    return rel, float(diff.abs().max().item()), ""


def poison(inputs: Any) -> None:
    out = inputs.get("out") if isinstance(inputs, dict) else None
    if out is None:
        return
    if hasattr(out, "fill_"):
        out.fill_(float("nan"))
    elif (isinstance(out, np.ndarray) or type(out).__module__.startswith("cupy")) and out.dtype.kind == "f":
        out.fill(np.nan)
