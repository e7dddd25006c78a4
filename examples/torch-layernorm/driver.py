"""cko driver for the PyTorch LayerNorm example (protocol cko/driver-v1, via operations.driver).

The harness owns the inputs and the reference; the subject (kernel.py) owns only `layer_norm`.

Case params: rows, cols (required); dtype "bf16" (default) or "fp32"; shift and scale of the
input distribution (defaults 1.0 and 3.0, so centring matters); eps (default 1e-5).
Metrics: "time" in any time unit; "bandwidth" in GB/s = the fewest bytes that must move / time.
"""

import torch

from operations.driver import main

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _dtype(case):
    name = case.get("dtype", "bf16")
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: one of {', '.join(DTYPES)}")
    return DTYPES[name]


def min_bytes(case):
    """Read x, write y, read weight and bias once: the least traffic any LayerNorm can have."""
    size = torch.empty((), dtype=_dtype(case)).element_size()
    return (2 * case["rows"] * case["cols"] + 2 * case["cols"]) * size


def flops(case):
    """Per element: sum, centre, square, accumulate, normalise, scale, shift (per-row rsqrt ignored)."""
    return 7 * case["rows"] * case["cols"]


def make_inputs(case, rng, device):
    rows, cols, dtype = case["rows"], case["cols"], _dtype(case)
    # Generated on the device from a seed drawn from the per-repetition rng: same for both subjects
    # of a pair, fresh per repetition, and fast even at hundreds of MB.
    gen = torch.Generator(device=device)
    gen.manual_seed(int(rng.integers(0, 2**63 - 1)))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    x = randn(rows, cols).mul_(case.get("scale", 3.0)).add_(case.get("shift", 1.0)).to(dtype)
    weight = randn(cols).mul_(0.1).add_(1.0).to(dtype)
    bias = randn(cols).mul_(0.1).to(dtype)
    return {"x": x, "weight": weight, "bias": bias, "eps": float(case.get("eps", 1e-5))}


def run(impl, inputs):
    return impl.layer_norm(inputs["x"], inputs["weight"], inputs["bias"], inputs["eps"])


def reference(case, inputs):
    x = inputs["x"].double()
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).square().mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + inputs["eps"]) * inputs["weight"].double() + inputs["bias"].double()


EXTRA_METRICS = {"bandwidth": ("GB/s", lambda case, t_ns: min_bytes(case) / t_ns)}

if __name__ == "__main__":
    raise SystemExit(main(make_inputs=make_inputs, run=run, reference=reference, extra_metrics=EXTRA_METRICS))
