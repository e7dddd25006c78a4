"""cko driver for the CUDA C++ row-sum example (protocol cko/driver-v1, via operations.driver).

Each subject is a directory holding `kernel.cu` (the request's `entry`) that exports

    extern "C" int launch(const float* in, float* out, int rows, int cols, cudaStream_t stream);

returning a cudaError_t. `load` compiles it with nvcc into /tmp/cko-build/<subject>/libkernel.so
(the subject directory is read-only), keeps ptxas -v's report beside it (ptxas.txt), and loads
it with ctypes. `run` launches on torch's current stream and raises on a non-zero return.
torch is used only for allocation, random inputs and the float64 reference.

Case params: rows, cols (required). Metrics: "time" in any time unit; "bandwidth" in GB/s
= the fewest bytes that must move / time. Needs device "cuda": a GPU and nvcc.
"""

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

from operations.driver import main

BUILD_ROOT = Path(os.environ.get("CKO_BUILD_ROOT", "/tmp/cko-build"))
NVCC_FLAGS = ["-O3", "-arch=sm_90a", "-Xptxas", "-v", "-shared", "-Xcompiler", "-fPIC"]

CUDA_ERRORS = {
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    9: "cudaErrorInvalidConfiguration",
    35: "cudaErrorInsufficientDriver",
    98: "cudaErrorInvalidDeviceFunction",
    100: "cudaErrorNoDevice",
    209: "cudaErrorNoKernelImageForDevice",
    222: "cudaErrorUnsupportedPtxVersion",
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",
    719: "cudaErrorLaunchFailure",
}


def find_nvcc():
    """$NVCC, then nvcc on PATH, then $CUDA_HOME/bin, $CUDA_PATH/bin and /usr/local/cuda/bin."""
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _require_gpu_and_nvcc():
    if not torch.cuda.is_available():
        raise RuntimeError("cuda-reduce driver needs a CUDA GPU and nvcc: torch.cuda.is_available() is False")
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "cuda-reduce driver needs a CUDA GPU and nvcc: no nvcc found "
            "($NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"
        )
    return nvcc


class Kernel:
    """A compiled subject: `launch` is the ctypes function; `so` and `ptxas` say what was built."""

    def __init__(self, so, ptxas, source_sha256):
        self.so = str(so)
        self.ptxas = ptxas
        self.source_sha256 = source_sha256
        self._lib = ctypes.CDLL(self.so, mode=os.RTLD_LOCAL)
        self.launch = self._lib.launch
        self.launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self.launch.restype = ctypes.c_int


def _build_dir(subject_id):
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", subject_id)
    return BUILD_ROOT / f"{safe}-{hashlib.sha256(subject_id.encode()).hexdigest()[:8]}"


def load(subject_id, path, entry):
    """Compile the subject's `entry` (kernel.cu) once per subject id and source, and load it."""
    nvcc = _require_gpu_and_nvcc()
    src = (Path(path) / entry).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"subject {subject_id}: {entry} not found in {path}")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out_dir = _build_dir(subject_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    so, log, stamp = out_dir / "libkernel.so", out_dir / "ptxas.txt", out_dir / "source.sha256"
    if not (so.is_file() and log.is_file() and stamp.is_file() and stamp.read_text().strip() == digest):
        for f in (so, stamp):
            f.unlink(missing_ok=True)
        cmd = [nvcc, *NVCC_FLAGS, "-o", str(so), str(src)]
        proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True, check=False)
        log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            raise RuntimeError(
                f"subject {subject_id}: nvcc failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        stamp.write_text(digest + "\n")
    return Kernel(so, log.read_text(), digest)


def min_bytes(case):
    """Read the matrix once, write one float per row."""
    return 4 * case["rows"] * case["cols"] + 4 * case["rows"]


def flops(case):
    return case["rows"] * case["cols"]


def make_inputs(case, rng, device):
    if device != "cuda":
        raise RuntimeError(
            f"cuda-reduce driver needs a CUDA GPU and nvcc: request device is {device!r}, not 'cuda'"
        )
    rows, cols = case["rows"], case["cols"]
    gen = torch.Generator(device=device)
    gen.manual_seed(int(rng.integers(0, 2**63 - 1)))
    x = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32)
    if case.get("shift"):
        x.add_(float(case["shift"]))
    out = torch.empty(rows, device=device, dtype=torch.float32)  # poisoned with NaN by the helper
    return {"x": x, "out": out, "rows": rows, "cols": cols}


def run(impl, inputs):
    x, out = inputs["x"], inputs["out"]
    stream = torch.cuda.current_stream(x.device).cuda_stream
    rc = impl.launch(x.data_ptr(), out.data_ptr(), inputs["rows"], inputs["cols"], stream)
    if rc != 0:
        raise RuntimeError(
            f"launch returned cudaError_t {rc} ({CUDA_ERRORS.get(rc, 'see cuda_runtime_api.h')})"
        )
    return out


def reference(case, inputs):
    return inputs["x"].double().sum(dim=1)


EXTRA_METRICS = {"bandwidth": ("GB/s", lambda case, t_ns: min_bytes(case) / t_ns)}

if __name__ == "__main__":
    raise SystemExit(
        main(make_inputs=make_inputs, run=run, reference=reference, load=load, extra_metrics=EXTRA_METRICS)
    )
