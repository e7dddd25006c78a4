"""Load cards from a directory of YAML files and lint them.

Each `*.yaml` file holds a YAML list of card mappings. The bundled cards live next to this
module (`knowledge/cards/`); every function takes the directory as a parameter so that tests and
`cko knowledge lint --cards-dir` can check another set.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from .model import Card, url_problem

DEFAULT_MAX_AGE_DAYS = 365

# Hosts whose documents count as primary sources for a `contract` card: the vendors' and the
# projects' own documentation and repositories.
PRIMARY_HOSTS: tuple[str, ...] = (
    "docs.nvidia.com",
    "developer.nvidia.com",
    "docs.pytorch.org",
    "pytorch.org",
    "triton-lang.org",
    "github.com",
)


def default_cards_dir() -> Path:
    return Path(__file__).resolve().parent / "cards"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the card set."""

    file: str
    message: str
    card: str | None = None
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        where = self.file + (f" [{self.card}]" if self.card else "")
        return f"{where}: {self.field + ': ' if self.field else ''}{self.message}"


class CardSetError(Exception):
    """The card set is broken (raised by load_cards; lint lists the same problems)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{len(problems)} problem(s) in the knowledge cards: {shown}{more}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a repeated key (a silently lost field otherwise)."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _construct_timestamp_as_text(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> str:
    # Dates stay text here; the card model parses them (and reports an impossible date as a field error).
    return str(loader.construct_scalar(node))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp_as_text)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(card)"


def read_cards(directory: Path | None = None) -> tuple[list[tuple[str, Card]], list[Problem]]:
    """Every valid card (with its file name) and every problem found while reading them."""
    directory = Path(directory) if directory is not None else default_cards_dir()
    problems: list[Problem] = []
    cards: list[tuple[str, Card]] = []
    if not directory.is_dir():
        return [], [Problem(file=str(directory), message="card directory does not exist")]
    files = sorted(directory.glob("*.yaml"))
    if not files:
        problems.append(Problem(file=str(directory), message="no *.yaml card files"))
    for path in files:
        name = path.name
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(file=name, message=f"cannot read: {exc}"))
            continue
        except (yaml.YAMLError, ValueError, TypeError) as exc:
            problems.append(Problem(file=name, message=f"not valid YAML: {exc}".replace("\n", " ")))
            continue
        if not isinstance(data, list):
            problems.append(Problem(file=name, message="a card file must hold a YAML list of cards"))
            continue
        for index, item in enumerate(data):
            card_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
            label = card_id or f"#{index}"
            if not isinstance(item, dict):
                problems.append(Problem(file=name, card=label, message="a card must be a mapping"))
                continue
            try:
                cards.append((name, Card.model_validate(item)))
            except ValidationError as exc:
                for err in exc.errors():
                    problems.append(
                        Problem(
                            file=name, card=label, field=_loc(tuple(err.get("loc", ()))), message=err["msg"]
                        )
                    )
    return cards, problems


def load_cards(directory: Path | None = None) -> list[Card]:
    """All cards, sorted by id; raise CardSetError when any card is invalid or an id repeats."""
    cards, problems = read_cards(directory)
    problems += _duplicate_problems(cards)
    if problems:
        raise CardSetError(problems)
    return sorted((c for _, c in cards), key=lambda c: c.id)


def _duplicate_problems(cards: list[tuple[str, Card]]) -> list[Problem]:
    first: dict[str, str] = {}
    out = []
    for name, card in cards:
        if card.id in first:
            out.append(
                Problem(
                    file=name, card=card.id, field="id", message=f"duplicate id (also in {first[card.id]})"
                )
            )
        else:
            first[card.id] = name
    return out


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def _is_primary(host: str) -> bool:
    return any(host == h or host.endswith("." + h) for h in PRIMARY_HOSTS)


@dataclass(frozen=True)
class LintReport:
    cards: int
    contracts: int
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "cards": self.cards,
            "contracts": self.contracts,
            "problems": [p.to_json() for p in self.problems],
        }


def lint(
    directory: Path | None = None,
    *,
    today: dt.date | None = None,
    max_age_days: int = DEFAULT_MAX_AGE_DAYS,
) -> LintReport:
    """Check a card set: every card valid, URLs well-formed, ids unique, reviews recent.

    A card reviewed more than `max_age_days` ago needs `stale_ok: <reason>`; a review date in the
    future is a problem; a `contract` card needs at least one source on a primary documentation
    host (PRIMARY_HOSTS).
    """
    today = today or dt.date.today()
    cards, problems = read_cards(directory)
    problems += _duplicate_problems(cards)
    for name, card in cards:
        for i, src in enumerate(card.sources):
            problem = url_problem(src.url)  # already enforced by the model; kept for clarity
            if problem:
                problems.append(Problem(file=name, card=card.id, field=f"sources.{i}.url", message=problem))
        age = (today - card.last_reviewed).days
        if age < 0:
            problems.append(
                Problem(
                    file=name,
                    card=card.id,
                    field="last_reviewed",
                    message=f"{card.last_reviewed} is in the future (today is {today})",
                )
            )
        elif age > max_age_days and not card.stale_ok:
            problems.append(
                Problem(
                    file=name,
                    card=card.id,
                    field="last_reviewed",
                    message=f"last reviewed {card.last_reviewed}, {age} days ago (limit {max_age_days}); "
                    "re-check the sources or add 'stale_ok: <reason>'",
                )
            )
        if card.kind == "contract" and not any(_is_primary(_host(s.url)) for s in card.sources):
            problems.append(
                Problem(
                    file=name,
                    card=card.id,
                    field="sources",
                    message="a contract card needs a primary source (one of: "
                    + ", ".join(PRIMARY_HOSTS)
                    + ")",
                )
            )
    return LintReport(
        cards=len(cards), contracts=sum(1 for _, c in cards if c.kind == "contract"), problems=problems
    )
