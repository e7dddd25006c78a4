"""`python -I -m operations sass [--sass F] [--ptxas F] [--resource F] [--binary F] --out D`,
`... sass --ptx F --out D` and `... sass --triton-kernel F [F...] [--triton-kernel ...] --out D`.

Compiler evidence into D/result.json (operations/evidence/sass.py). With --binary, runs
`cuobjdump --dump-sass` and `cuobjdump --dump-resource-usage` on it here (the cuda image has
cuobjdump), keeps both dumps in D, and parses them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..evidence import opmain
from ..evidence.common import Refusal
from ..evidence.compiler_evidence import parse_ptx_evidence, parse_triton_evidence
from ..evidence.sass import SassFacts, parse_compiler_evidence

CUOBJDUMP_TIMEOUT = 300


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    for cand in (found, "/usr/local/cuda/bin/cuobjdump"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise Refusal("tool_unavailable", "cuobjdump is not in this image (use the cuda image)", field="binary")


def _dump(tool: str, flag: str, binary: Path, dest: Path) -> None:
    # cuobjdump writes scratch files (tmpxft_*) to TMPDIR or its working directory: give it a
    # private writable one on the container's tmpfs.
    scratch = tempfile.mkdtemp(prefix="cuobjdump-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        with open(dest, "w", encoding="utf-8") as out:
            proc = subprocess.run(
                [tool, flag, str(binary)],
                cwd=scratch,
                env={**os.environ, "TMPDIR": scratch, "TMP": scratch, "TEMP": scratch},
                stdout=out,
                stderr=subprocess.PIPE,
                timeout=CUOBJDUMP_TIMEOUT,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise Refusal(
            "too_slow", f"cuobjdump {flag} ran past {CUOBJDUMP_TIMEOUT} s", field="binary"
        ) from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[:300]
        raise Refusal(
            "not_cuda_binary", f"cuobjdump {flag} failed (exit {proc.returncode}): {err}", field="binary"
        )


def _version(tool: str) -> str | None:
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        if "release" in line or line.startswith("Cuda compilation tools"):
            return line.strip()[:200]
    return None


def _build(p: opmain.ArgParser) -> None:
    p.add_argument("--sass", type=Path, default=None, help="cuobjdump --dump-sass output")
    p.add_argument("--ptxas", type=Path, default=None, help="ptxas -v / nvcc -Xptxas -v output")
    p.add_argument("--resource", type=Path, default=None, help="cuobjdump --dump-resource-usage output")
    p.add_argument(
        "--binary", type=Path, default=None, help="executable, object, fatbin or cubin to dump here"
    )
    p.add_argument("--ptx", type=Path, default=None, help="a PTX file")
    p.add_argument(
        "--triton-kernel",
        type=Path,
        nargs="+",
        action="append",
        default=None,
        help="one Triton kernel's cache files (.json, .ttir, .ttgir, .llir, .ptx, ...); repeat per kernel",
    )
    p.add_argument("--tool-version", default=None, help="cuobjdump / CUDA version the dumps came from")
    opmain.add_binding(p)


def _body(a: argparse.Namespace) -> SassFacts:
    others = (a.sass, a.ptxas, a.resource, a.binary)
    if a.ptx is not None or a.triton_kernel:
        if (a.ptx is not None and a.triton_kernel) or any(x is not None for x in others):
            raise Refusal(
                "bad_request", "give --ptx, --triton-kernel or the SASS inputs, one kind", field="ptx"
            )
        if a.ptx is not None:
            return parse_ptx_evidence(a.ptx, bound_to=opmain.binding(a))
        return parse_triton_evidence(a.triton_kernel, bound_to=opmain.binding(a))
    sass, resource, version = a.sass, a.resource, a.tool_version
    if a.binary is not None:
        if sass is not None or resource is not None:
            raise Refusal("bad_request", "give --binary or --sass/--resource, not both", field="binary")
        if not a.binary.is_file():
            raise Refusal("unreadable", f"{a.binary} is not a regular file", field="binary")
        tool = _cuobjdump()
        a.out.mkdir(parents=True, exist_ok=True)
        sass, resource = a.out / "sass.txt", a.out / "resource_usage.txt"
        _dump(tool, "--dump-sass", a.binary, sass)
        _dump(tool, "--dump-resource-usage", a.binary, resource)
        version = version or _version(tool)
    return parse_compiler_evidence(
        sass=sass, ptxas=a.ptxas, resource=resource, tool_version=version, bound_to=opmain.binding(a)
    )


def main(argv: list[str]) -> int:
    return opmain.run("sass", argv, _build, _body)
