"""Exit codes and the one exception type the CLI turns into them (DESIGN.md, CLI)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Exit(IntEnum):
    DONE = 0
    FAILED = 1  # the operation ran and failed (workload error, accuracy, audit mismatch)
    BAD_REQUEST = 2  # bad request or usage: nothing written
    REFUSED = 3  # refused by policy
    TIMED_OUT = 4
    UNAVAILABLE = 5  # no engine, no image, no GPU where one is required
    INTERRUPTED = 130  # Ctrl-C / SIGINT, as shells report it


class CkoError(Exception):
    """An error with an exit code, a machine-readable code and the field it concerns."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: Exit = Exit.BAD_REQUEST,
        code: str = "bad_request",
        field: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.code = code
        self.field = field
        self.detail = detail or {}

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"error": self.code, "message": self.message, "exit_code": int(self.exit_code)}
        if self.field is not None:
            doc["field"] = self.field
        if self.detail:
            doc["detail"] = self.detail
        return doc


def bad_request(message: str, field: str | None = None, code: str = "bad_request") -> CkoError:
    return CkoError(message, exit_code=Exit.BAD_REQUEST, code=code, field=field)


def unavailable(message: str, code: str = "unavailable", field: str | None = None) -> CkoError:
    return CkoError(message, exit_code=Exit.UNAVAILABLE, code=code, field=field)


def refused(message: str, rule: str) -> CkoError:
    return CkoError(message, exit_code=Exit.REFUSED, code="refused_by_policy", field=rule)


def failed(message: str, code: str = "failed", field: str | None = None) -> CkoError:
    return CkoError(message, exit_code=Exit.FAILED, code=code, field=field)


def pydantic_error(exc: Any, what: str) -> CkoError:
    """Turn a pydantic ValidationError into a CkoError naming the first failing field."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    loc = ".".join(str(p) for p in first.get("loc", ())) or None
    msg = f"{what}: {loc or '(root)'}: {first.get('msg')}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more)"
    err = bad_request(msg, field=loc, code="invalid_request")
    err.detail = {
        "errors": [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg")} for e in errors[:20]
        ]
    }
    return err
