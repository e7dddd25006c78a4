"""cko driver for the NumPy softmax example (protocol cko/driver-v1, via operations.driver).

The harness owns the inputs and the reference; the subject (kernel.py) owns only `softmax`.
"""

import numpy as np

from operations.driver import main


def make_inputs(case, rng, device):
    rows, cols = case["rows"], case["cols"]
    return {"x": rng.standard_normal((rows, cols)) * case.get("scale", 4.0)}


def run(impl, inputs):
    return impl.softmax(inputs["x"])


def reference(case, inputs):
    x = inputs["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


if __name__ == "__main__":
    raise SystemExit(main(make_inputs=make_inputs, run=run, reference=reference))
