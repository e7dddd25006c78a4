"""Base classes for requests and records: closed objects, canonical serialisation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Closed(BaseModel):
    """A request or record: unknown fields are errors, values are validated strictly enough."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Ref(Closed):
    """A reference to a record: its id and the sha256 of its canonical bytes."""

    id: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ObjectRef(Closed):
    """A content-addressed blob in objects/sha256."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    name: str | None = None
    media_type: str | None = None
