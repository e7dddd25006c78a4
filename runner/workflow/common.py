"""Helpers every workflow operation shares: requests, the Target, records, snapshots by digest."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import CkoError, Exit, bad_request, failed, pydantic_error
from ..models import Ref
from ..store import Store, check_id
from .records import Snapshot, Target, Variant

R = TypeVar("R", bound=BaseModel)
Progress = Callable[[str], None]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_request(path: Path, cls: type[R]) -> tuple[R, Path]:
    from ..cliutil import load_json_file

    doc = load_json_file(path, "request")
    if not isinstance(doc, dict):
        raise bad_request("request: must be a JSON object", field="request")
    try:
        return cls.model_validate(doc), Path(path).absolute().parent
    except ValidationError as exc:
        raise pydantic_error(exc, f"request {path}") from None


def with_ids(req: R, **ids: str | None) -> R:
    """Fill ids given on the command line (--target, --variant) into a request."""
    update = {k: v for k, v in ids.items() if v is not None}
    for k, v in update.items():
        check_id(v, k)
    return req.model_copy(update=update) if update else req


def get_target(store: Store, target_id: str | None) -> tuple[Target, Ref]:
    if not target_id:
        raise bad_request("target: give --target ID or a target field in the request", field="target")
    check_id(target_id, "target")
    t, ref = store.get_record("targets", target_id, Target)
    return t, Ref(**ref)


def put_record(store: Store, kind: str, rid: str, model: BaseModel) -> Ref:
    with store.writer():
        return Ref(**store.put_record(kind, rid, model))


def require_optimization(t: Target) -> None:
    if t.mode != "optimization":
        raise CkoError(
            f"target {t.id} is diagnostic: it binds reports only and can carry no performance claim",
            exit_code=Exit.BAD_REQUEST,
            code="diagnostic_target",
            field="target",
        )


def snapshot_by_sha(store: Store, t: Target, sha: str) -> Snapshot:
    assert t.original
    if sha == t.original.sha256:
        return t.original
    for vid in store.list_records("variants"):
        v, _ = store.get_record("variants", vid, Variant)
        if v.snapshot.sha256 == sha:
            return v.snapshot
    raise failed(f"snapshot {sha[:16]} is not in the store", code="missing_snapshot")
