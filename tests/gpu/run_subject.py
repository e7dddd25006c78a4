"""Run one subject of an example once on the GPU, bare, through the example's own driver functions.

    TRITON_CACHE_DIR=DIR python3 tests/gpu/run_subject.py EXAMPLE_DIR SUBJECT.py '{"rows": ...}'

For compiler evidence of the exact subject file (its Triton cache: TTIR, TTGIR, LLIR, PTX, cubin).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def load_module(path: Path, name: str) -> Any:
    """A Python file as a module of its own (an example's driver or a subject), without sys.path."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(example: str, subject: str, params: str) -> int:
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the driver imports operations.driver
    driver = load_module(Path(example) / "driver.py", "cko_example_driver")
    impl = load_module(Path(subject), "cko_example_subject")
    out = driver.run(impl, driver.make_inputs(json.loads(params), np.random.default_rng(0), "cuda"))
    torch.cuda.synchronize()
    print(f"ran {subject}: output {tuple(out.shape)} {out.dtype}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
