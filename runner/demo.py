"""`cko demo`: the whole loop on the bundled NumPy example, in a fresh store, with progress.

readiness → baseline → variant → screen → target → champion select → audit → report.
cko never picks the champion by itself: the demo plays the caller and selects only because the
target stage accepted — exactly the check `cko champion select` enforces.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .errors import CkoError, failed, pydantic_error
from .images import repo_root
from .report import gather, html_report, text
from .store import Store
from .workflow import champion, ops
from .workflow.audit import audit, junit
from .workflow.experiment import experiment
from .workflow.requests import BaselineRequest, ExperimentRequest, ReadinessRequest, VariantRequest

STEPS = ["readiness", "baseline", "variant", "screen", "target", "champion select", "audit", "report"]


def _readiness_request(ex: Path, image: str | None) -> tuple[ReadinessRequest, Path]:
    """The example's readiness request, in `image` when given (validated as the request's own field
    would be: an error names `image`)."""
    req, base = ops.load_request(ex / "readiness.json", ReadinessRequest)
    if image is None:
        return req, base
    try:
        return ReadinessRequest.model_validate(req.model_dump(mode="json") | {"image": image}), base
    except ValidationError as exc:
        raise pydantic_error(exc, "--image") from None


def run_demo(store_dir: Path, example: str, console: Console, image: str | None = None) -> dict[str, Any]:
    ex = repo_root() / "examples" / example
    if not (ex / "readiness.json").is_file():
        raise failed(f"example {example} not found at {ex}", code="missing_example")
    if store_dir.exists() and any(store_dir.iterdir()):
        raise CkoError(
            f"--store {store_dir} is not empty; the demo runs in a fresh store",
            code="store_not_empty",
            field="store",
        )
    req, base = _readiness_request(ex, image)  # validated before the store is touched
    store = Store(store_dir)
    summary: dict[str, Any] = {"store": str(store.root), "example": example, "steps": {}}
    t_start = time.monotonic()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        TextColumn("{task.fields[note]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as prog:
        task = prog.add_task("cko demo", total=len(STEPS), note="")

        def step(name: str) -> None:
            prog.update(task, description=name, note="")

        def note(msg: str) -> None:
            prog.update(task, note=msg[:60])

        def done(name: str, result: Any) -> None:
            summary["steps"][name] = result
            prog.advance(task)

        step("readiness")
        doc, code = ops.readiness(store, req, base, note)
        if code:
            raise failed(f"readiness: not ready: {doc.get('blockers')}", code="not_ready")
        tid = doc["target"]["id"]
        done("readiness", doc)

        step("baseline")
        breq, _ = ops.load_request(ex / "baseline.json", BaselineRequest)
        doc, _ = ops.baseline(store, ops.with_ids(breq, target=tid), note)
        done("baseline", doc)

        step("variant")
        vreq, vbase = ops.load_request(ex / "variant.json", VariantRequest)
        doc, _ = ops.variant(store, ops.with_ids(vreq, target=tid), vbase)
        vid = doc["variant"]["id"]
        done("variant", doc)

        step("screen")
        sreq, _ = ops.load_request(ex / "screen.json", ExperimentRequest)
        screen, code = experiment(store, ops.with_ids(sreq, target=tid, variant=vid), note)
        done("screen", screen)
        if screen["stage_outcome"] == "rejected" or code:
            raise failed(f"the screen rejected the candidate: {screen['reasons']}", code="screen_rejected")

        step("target")
        treq, _ = ops.load_request(ex / "target.json", ExperimentRequest)
        tdoc, code = experiment(store, ops.with_ids(treq, target=tid, variant=vid), note)
        done("target", tdoc)

        step("champion select")
        if tdoc["stage_outcome"] == "accepted":
            doc, _ = champion.select(store, tdoc["experiment"]["id"], "demo: target stage accepted")
            done("champion select", doc)
        else:
            done(
                "champion select",
                {"skipped": f"target stage outcome {tdoc['stage_outcome']}: nothing to select"},
            )

        step("audit")
        adoc = audit(store, note)
        (store.report_path("audit.junit.xml")).write_bytes(junit(adoc))
        done("audit", {"answer": adoc["answer"], "holds": adoc["holds"], "summary": adoc["summary"]})

        step("report")
        data = gather(store)
        (store.report_path("report.html")).write_text(html_report(store, data))
        (store.report_path("report.txt")).write_text(text(data))
        done(
            "report",
            {"html": str(store.report_path("report.html")), "text": str(store.report_path("report.txt"))},
        )
    summary["seconds"] = round(time.monotonic() - t_start, 1)
    summary["target_outcome"] = tdoc["stage_outcome"]
    summary["cases"] = tdoc["cases"]
    summary["audit_holds"] = adoc["holds"]
    summary["audit_answer"] = adoc["answer"]
    return summary
