"""`measure`: drive the user's workload by the protocol, in the supervisor's container.

Reads a measurement plan (the driver request, the driver command, the boundary), runs the
driver once — as cko's supervisor (`workers`: each subject in its own worker container, started
by the host) or, for a hand-written driver, as the one process that loads every subject
(`harness_trusted`) — validates the result against the contract and writes /cko/out/result.json.
Nothing the driver writes elsewhere under /cko/out survives: the output directory is cleaned to
what this operation wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import ContractError, DriverRequest, DriverResult, validate_result

TAIL = 4000


class DriverSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    command: list[str] = Field(min_length=1)
    cwd: str = "/cko/harness"
    env: dict[str, str] = Field(default_factory=dict)


class MeasurePlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    driver: DriverSpec
    boundary: Literal["workers", "harness_trusted"] = "workers"
    request: DriverRequest
    process_timeout_s: float = Field(gt=0)


def _tail(path: Path) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - TAIL))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_driver(
    plan: MeasurePlan, sub: DriverRequest, n: int, work: Path
) -> tuple[DriverResult | None, dict[str, Any]]:
    d = work / f"p{n:04d}"
    d.mkdir(parents=True)
    result_path = d / "result.json"
    sub = sub.model_copy(update={"result_path": str(result_path)})
    info: dict[str, Any] = {"index": n, "subjects": [s.id for s in sub.subjects], "items": len(sub.schedule)}
    t0 = time.monotonic()
    code = _run_process(plan, sub, d)
    info["wall_s"] = round(time.monotonic() - t0, 3)
    info["exit_code"] = code
    info["stderr_tail"] = _tail(d / "stderr")
    info["stdout_bytes"] = (d / "stdout").stat().st_size
    res, error = _read_result(plan, sub, n, code, info["stderr_tail"])
    if res is None:
        info["error"] = error
    return res, info


def _run_process(plan: MeasurePlan, sub: DriverRequest, d: Path) -> int | None:
    """Run the driver on its request in d (stdout, stderr beside it); its exit code, None when it ran
    past the process timeout and was killed with its whole session."""
    # Cases keep their position in the full request so input seeds match across processes.
    req_path = d / "request.json"
    req_path.write_text(sub.model_dump_json())
    role = {"CKO_ROLE": "supervisor"} if plan.boundary == "workers" else {}
    env = (
        {k: v for k, v in os.environ.items()} | plan.driver.env | {"CKO_DRIVER_REQUEST": str(req_path)} | role
    )
    with open(d / "stdout", "wb") as so, open(d / "stderr", "wb") as se:
        proc = subprocess.Popen(
            [*plan.driver.command, str(req_path)],
            cwd=plan.driver.cwd,
            env=env,
            stdout=so,
            stderr=se,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=plan.process_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def _read_result(
    plan: MeasurePlan, sub: DriverRequest, n: int, code: int | None, stderr_tail: str
) -> tuple[DriverResult | None, Any]:
    """The driver's result, or the error that stands in its place (the driver's own failure report
    when it wrote one, else what its exit and its result file show)."""
    result_path = Path(sub.result_path)
    if code is None:
        return None, {
            "code": "driver_timed_out",
            "field": "driver",
            "message": f"driver process {n} ran past {plan.process_timeout_s:g}s and was killed",
        }
    failure_path = result_path.with_name(result_path.name + ".failure")
    if code != 0 and failure_path.is_file():
        try:
            return None, json.loads(failure_path.read_text())
        except ValueError:
            pass
    if code != 0:
        hint = (
            " (a hand-written driver that does not call operations.driver.main needs driver.kind "
            "harness_trusted)"
            if plan.boundary == "workers"
            else ""
        )
        return None, {
            "code": "driver_crashed",
            "field": "driver",
            "message": f"driver process {n} exited with {code}{hint}: {stderr_tail[-500:]}",
        }
    if not result_path.is_file():
        return None, {
            "code": "result_not_written",
            "field": "result_path",
            "message": f"driver process {n} exited 0 but wrote no result",
        }
    return _parse_result(sub, result_path)


def _parse_result(sub: DriverRequest, result_path: Path) -> tuple[DriverResult | None, dict[str, Any] | None]:
    """The result file as a DriverResult of the request's protocol, or why it is not one."""
    try:
        raw = json.loads(result_path.read_bytes())
    except (OSError, ValueError) as exc:
        return None, {"code": "result_not_json", "field": "result", "message": f"result is not JSON: {exc}"}
    if isinstance(raw, dict) and raw.get("protocol") not in (None, sub.protocol):
        return None, {
            "code": "unknown_protocol",
            "field": "protocol",
            "message": f"result protocol {raw.get('protocol')!r}, expected {sub.protocol}",
        }
    try:
        return DriverResult.model_validate(raw), None
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(x) for x in e["loc"]) or "result"
        err_code = "non_finite" if "finite" in e["msg"] else "invalid_result"
        return None, {"code": err_code, "field": field, "message": f"result.{field}: {e['msg']}"}


def measure(plan: MeasurePlan, out: Path, work: Path) -> dict[str, Any]:
    res, info = run_driver(plan, plan.request, 0, work)
    doc: dict[str, Any] = {"processes": [info], "failure": info.get("error"), "boundary": plan.boundary}
    if res is None:
        return doc
    if plan.boundary == "workers" and res.boundary != "workers":
        doc["failure"] = {
            "code": "driver_not_helper",
            "field": "driver.kind",
            "message": "the driver did not run as cko's supervisor (it does not call "
            "operations.driver.main); a hand-written driver needs driver.kind "
            "harness_trusted, and its records say the candidate shared its process",
        }
        return doc
    errs = validate_result(plan.request, res)
    doc["contract_errors"] = [e.model_dump() for e in errs]
    if errs:  # a result that breaks the contract (non-finite samples ...) is reported, not passed on
        doc["failure"] = errs[0].model_dump() | {"all": [e.model_dump() for e in errs]}
        return doc
    doc["driver_result"] = res.model_dump(mode="json")
    return doc


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="operations measure")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/cko-measure")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        plan = MeasurePlan.model_validate_json(Path(args.plan).read_bytes())
    except (OSError, ValidationError) as exc:
        msg = str(exc).splitlines()[0]
        doc: dict[str, Any] = {"failure": {"code": "invalid_plan", "field": "plan", "message": msg}}
    else:
        work = Path(args.work)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        doc = measure(plan, out, work)
    # Only what this operation writes leaves the container (and the probe, written before the driver, and
    # the files a profiler wrapping the driver was told to write, named in CKO_KEEP_OUTPUTS).
    keep = {".cko", *[k for k in os.environ.get("CKO_KEEP_OUTPUTS", "").split(",") if k]}
    for child in out.iterdir():
        if child.name not in keep:
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(doc, sort_keys=True, allow_nan=False, default=str))
    os.replace(tmp, out / "result.json")
    return 0 if doc.get("failure") is None else 1


__all__ = ["ContractError", "MeasurePlan", "main"]
