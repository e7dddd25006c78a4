"""The card model: one documented fact (`contract`) or one direction worth trying (`heuristic`).

Cards are YAML files in `knowledge/cards/`; each file holds a list of cards. The model is closed:
an unknown field is an error, so a typo never silently drops a condition.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .arch import ArchError, parse_arch
from .versions import VersionError, parse_spec, parse_version

Kind = Literal["contract", "heuristic"]

# The closed topic vocabulary; `cko knowledge query --topic` takes one of these.
Topic = Literal[
    "async-copy",
    "attention",
    "caching",
    "clusters",
    "collectives",
    "compatibility",
    "compilation",
    "cuda-graphs",
    "data-loading",
    "data-transfer",
    "launch-overhead",
    "measurement",
    "memory",
    "memory-allocation",
    "occupancy",
    "precision",
    "profiling",
    "pytorch",
    "registers",
    "serving",
    "shared-memory",
    "synchronization",
    "tensor-cores",
    "triton",
]
TOPICS: tuple[str, ...] = get_args(Topic)

_LIB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Conditions(_Closed):
    """When a card applies. Every field given must hold; an absent field is no condition.

    An identity that does not say what a condition needs (no arch, no torch version...) makes the
    card `related`, never `applies`.
    """

    archs: list[str] | None = Field(
        default=None,
        description="Devices the card is about, as targets: 'sm_90' (exactly 9.0), 'sm_90a' "
        "(exactly 9.0, architecture-specific target), 'sm_100f' (10.x with minor >= 0).",
        min_length=1,
    )
    min_arch: str | None = Field(
        default=None, description="Lowest compute capability, e.g. 'sm_80' (no suffix)."
    )
    max_arch: str | None = Field(
        default=None, description="Highest compute capability, e.g. 'sm_90' (no suffix)."
    )
    min_driver: str | None = Field(default=None, description="Lowest NVIDIA driver version, e.g. '570.26'.")
    cuda: str | None = Field(default=None, description="CUDA toolkit version specifier, e.g. '>=12.8'.")
    libs: dict[str, str] = Field(
        default_factory=dict,
        description="Library or tool name -> version specifier, e.g. {torch: '>=2.2,<3', ncu: '>=2023.1'}.",
    )

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        out = []
        for a in v:
            try:
                out.append(str(parse_arch(a)))
            except ArchError as exc:
                raise ValueError(str(exc)) from None
        if len(set(out)) != len(out):
            raise ValueError(f"duplicate architecture in {out}")
        return out

    @field_validator("min_arch", "max_arch")
    @classmethod
    def _bound(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            arch = parse_arch(v)
        except ArchError as exc:
            raise ValueError(str(exc)) from None
        if arch.suffix:
            raise ValueError(f"{v!r}: a bound is a compute capability; drop the '{arch.suffix}' suffix")
        return str(arch)

    @field_validator("min_driver")
    @classmethod
    def _driver(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            parse_version(v)
        except VersionError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(parse_spec(v))
        except VersionError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("libs")
    @classmethod
    def _libs(cls, v: dict[str, str]) -> dict[str, str]:
        out = {}
        for name, spec in v.items():
            if not _LIB_NAME_RE.match(name):
                raise ValueError(f"library name {name!r} must be lower case (e.g. torch, triton, ncu)")
            try:
                out[name] = str(parse_spec(spec))
            except VersionError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return out

    @model_validator(mode="after")
    def _range(self) -> Conditions:
        if self.min_arch and self.max_arch and parse_arch(self.min_arch).cc > parse_arch(self.max_arch).cc:
            raise ValueError(f"min_arch {self.min_arch} is above max_arch {self.max_arch}")
        return self

    def is_empty(self) -> bool:
        return not (self.archs or self.min_arch or self.max_arch or self.min_driver or self.cuda or self.libs)


class Source(_Closed):
    """A primary source and what it supports."""

    title: str = Field(min_length=3, description="Document title, e.g. 'CUDA C++ Programming Guide'.")
    url: str = Field(description="https URL of the document.")
    section: str = Field(min_length=2, description="Section name or number in the document.")
    supports: str = Field(min_length=5, description="What this source establishes for the card.")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        problem = url_problem(v)
        if problem:
            raise ValueError(problem)
        return v


class Check(_Closed):
    """How to see for yourself whether the card's statement holds, or whether a path is taken."""

    how: str = Field(min_length=10, description="What to look at and what it shows.")
    sass: list[str] = Field(
        default_factory=list, description="SASS opcodes that prove the path (cuobjdump -sass)."
    )
    ncu_metrics: list[str] = Field(default_factory=list, description="Nsight Compute metrics that show it.")
    commands: list[str] = Field(default_factory=list, description="Commands or API calls that show it.")
    facts: list[str] = Field(
        default_factory=list,
        description="Collected facts that show it, as <source>.<field> of a parser's result "
        "(e.g. torch.memcpy_summary from `cko profile torch --collect`).",
    )

    @field_validator("facts")
    @classmethod
    def _facts(cls, v: list[str]) -> list[str]:
        from .facts import fact_problem

        problems = [p for p in (fact_problem(f) for f in v) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return v


class Card(_Closed):
    """One knowledge card."""

    id: str = Field(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$", max_length=80, description="Stable kebab-case id.")
    title: str = Field(min_length=3, max_length=120)
    statement: str = Field(min_length=10, max_length=700, description="The fact or direction, short.")
    kind: Kind = Field(
        description="contract: documented in a primary source; heuristic: a direction worth trying."
    )
    applies_when: Conditions = Field(default_factory=Conditions)
    topics: list[Topic] = Field(min_length=1)
    sources: list[Source] = Field(min_length=1)
    last_reviewed: dt.date = Field(
        description="When the card was last checked against its sources (YYYY-MM-DD)."
    )
    check: Check
    stale_ok: str | None = Field(
        default=None, min_length=5, description="Why the card may stay past its review age (lint accepts it)."
    )

    @field_validator("last_reviewed", mode="before")
    @classmethod
    def _date(cls, v: Any) -> Any:
        # YAML gives a date for an unquoted YYYY-MM-DD; accept that or exactly that string, nothing else.
        if isinstance(v, dt.datetime):
            raise ValueError("last_reviewed is a date (YYYY-MM-DD), not a timestamp")
        if isinstance(v, dt.date):
            return v
        if isinstance(v, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", v):
            try:
                return dt.date.fromisoformat(v)
            except ValueError:
                raise ValueError(f"last_reviewed {v!r} is not a calendar date") from None
        raise ValueError(f"last_reviewed must be a date YYYY-MM-DD, got {v!r}")

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate topic in {v}")
        return v


def url_problem(url: str) -> str | None:
    """None when `url` is a well-formed https URL with a host; otherwise what is wrong."""
    if not isinstance(url, str) or not url:
        return "url is empty"
    if any(c.isspace() for c in url):
        return f"url {url!r} contains whitespace"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"url {url!r} is malformed: {exc}"
    if parts.scheme != "https":
        return f"url {url!r} must use https"
    host = parts.hostname or ""
    if not host or "." not in host or host.startswith(".") or host.endswith("."):
        return f"url {url!r} has no valid host"
    if parts.username or parts.password:
        return f"url {url!r} must not carry credentials"
    return None


def schema() -> dict[str, Any]:
    """JSON Schema of one card (for `cko schema card`)."""
    return Card.model_json_schema()
