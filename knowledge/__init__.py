"""Offline knowledge cards and their identity-aware query (DESIGN.md, `cko knowledge query`).

A card is one documented fact (`contract`, from a primary source) or one direction worth trying
(`heuristic`), with the conditions under which it holds (architecture, driver, CUDA and library
versions), its sources and how to check it. `query` classifies every card against an identity as
`applies`, `related` (a condition cannot be decided, or only the topic relates) or
`does_not_apply` (with the condition that fails). Cards never decide anything; they inform.
"""

from __future__ import annotations

from .loader import CardSetError, LintReport, Problem, default_cards_dir, lint, load_cards, read_cards
from .model import TOPICS, Card, Check, Conditions, Source, schema
from .query import (
    Answer,
    Identity,
    IdentityError,
    Result,
    classify,
    identity_from_target,
    identity_from_target_doc,
    make_identity,
    parse_lib_options,
    query,
)

__all__ = [
    "TOPICS",
    "Answer",
    "Card",
    "CardSetError",
    "Check",
    "Conditions",
    "Identity",
    "IdentityError",
    "LintReport",
    "Problem",
    "Result",
    "Source",
    "classify",
    "default_cards_dir",
    "identity_from_target",
    "identity_from_target_doc",
    "lint",
    "load_cards",
    "make_identity",
    "parse_lib_options",
    "query",
    "read_cards",
    "schema",
]
