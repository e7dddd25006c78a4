"""`cko knowledge query|lint`: offline knowledge cards, classified against an identity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

import cko_perf.knowledge as kb
from cko_perf.knowledge import TOPICS, Answer, CardSetError, IdentityError, LintReport
from cko_perf.knowledge.loader import DEFAULT_MAX_AGE_DAYS

from ..cliutil import Outcome, common, handled
from ..errors import CkoError, Exit, bad_request

_STYLE = {"applies": "bold green", "related": "yellow", "does_not_apply": "dim"}


@click.group("knowledge")
def knowledge() -> None:
    """Offline knowledge cards: documented facts (contract) and directions worth trying (heuristic).

    Cards inform; they never decide or block anything.
    """


def _card_set_error(err: CardSetError) -> CkoError:
    return CkoError(
        str(err),
        exit_code=Exit.FAILED,
        code="invalid_cards",
        detail={"problems": [p.to_json() for p in err.problems]},
    )


def _identity_line(answer: Answer) -> Text:
    ident = answer.identity
    parts = [
        f"arch={ident.arch or '?'}",
        f"driver={ident.driver or '?'}",
        f"cuda={ident.cuda or '?'}",
    ]
    if ident.cuda_driver:
        parts.append(f"cuda_driver={ident.cuda_driver}")
    parts += [f"{k}={v}" for k, v in sorted(ident.libs.items())]
    if answer.topics:
        parts.append(f"topic={','.join(answer.topics)}")
    return Text("identity: " + " ".join(parts))


def _render_answer(answer: Answer) -> Group:
    items: list[Any] = [_identity_line(answer), Text(answer.message())]
    shown = [r for r in answer.results if r.classification != "does_not_apply"]
    if shown:
        table = Table(show_lines=True, expand=True)
        table.add_column("class", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("card", ratio=2)
        table.add_column("statement", ratio=5)
        table.add_column("check / source", ratio=3, overflow="fold")
        for r in shown:
            c = r.card
            check = c.check.how
            if c.check.sass:
                check += "\nSASS: " + ", ".join(c.check.sass)
            if c.check.ncu_metrics:
                check += "\nncu: " + ", ".join(c.check.ncu_metrics)
            if c.check.facts:
                check += "\nfacts: " + ", ".join(c.check.facts)
            src = "\n".join(f"{s.title}, {s.section}: {s.url}" for s in c.sources)
            table.add_row(
                Text(r.classification, style=_STYLE[r.classification]),
                c.kind,
                Text(f"{c.id}\n{c.title}"),
                Text(c.statement + ("" if r.classification == "applies" else f"\n[{r.reason}]")),
                Text(check + "\n" + src),
            )
        items.append(table)
    rest = [r for r in answer.results if r.classification == "does_not_apply" and not r.outside_topics]
    hidden = sum(1 for r in answer.results if r.outside_topics)
    if rest:
        table = Table(title="does not apply", expand=True)
        table.add_column("card", ratio=2)
        table.add_column("failing condition", ratio=5, overflow="fold")
        for r in rest:
            table.add_row(Text(r.card.id), Text(r.reason))
        items.append(table)
    if hidden:
        items.append(
            Text(
                f"{hidden} card(s) outside the topic filter not shown (--json lists every card)", style="dim"
            )
        )
    return Group(*items)


@knowledge.command("query")
@click.option(
    "--arch", help="GPU architecture: sm_80, sm_89, sm_90, sm_90a, sm_100 ... or a compute capability (9.0)."
)
@click.option("--driver", help="NVIDIA driver version, e.g. 580.159.04.")
@click.option("--cuda", help="CUDA toolkit version in use, e.g. 13.0.")
@click.option("--lib", "libs", multiple=True, help="NAME=VER, e.g. torch=2.11.0 (repeatable).")
@click.option(
    "--topic", "topics", multiple=True, help="Only cards with this topic (repeatable): " + ", ".join(TOPICS)
)
@click.option(
    "--from-target",
    "from_target",
    help="Take the identity frozen in <store>/targets/ID.json; options override it.",
)
@click.option(
    "--cards-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Card directory to query (default: the bundled cards).",
)
@common
@handled
def query_cmd(
    store: Path,
    as_json: bool,
    arch: str | None,
    driver: str | None,
    cuda: str | None,
    libs: tuple[str, ...],
    topics: tuple[str, ...],
    from_target: str | None,
    cards_dir: Path | None,
) -> Outcome:
    """Classify every card as applies, related or does_not_apply for an identity.

    A card whose condition the identity does not settle (e.g. no torch version given) is related,
    never applies. An empty answer is exit 0: nothing here blocks anything.
    """
    try:
        base = kb.identity_from_target(store, from_target) if from_target else None
        identity = kb.make_identity(
            arch=arch, driver=driver, cuda=cuda, libs=kb.parse_lib_options(libs), base=base
        )
        answer = kb.query(identity, list(topics), cards_dir=cards_dir)
    except IdentityError as err:
        raise bad_request(err.message, field=err.field) from None
    except CardSetError as err:
        raise _card_set_error(err) from None
    doc = answer.to_json()
    if from_target:
        doc["from_target"] = from_target
    return Outcome(doc=doc, human=_render_answer(answer))


def _render_lint(report: LintReport, directory: Path) -> Group:
    head = Text(
        f"{report.cards} cards ({report.contracts} contract) in {directory}: "
        + ("ok" if report.ok else f"{len(report.problems)} problem(s)"),
        style="green" if report.ok else "bold red",
    )
    if report.ok:
        return Group(head)
    table = Table(expand=True)
    table.add_column("file")
    table.add_column("card")
    table.add_column("field")
    table.add_column("problem", ratio=4)
    for p in report.problems:
        table.add_row(Text(p.file), Text(p.card or ""), Text(p.field or ""), Text(p.message))
    return Group(head, table)


@knowledge.command("lint")
@click.option(
    "--cards-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Card directory to check (default: the bundled cards).",
)
@click.option(
    "--max-age-days",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_AGE_DAYS,
    show_default=True,
    help="A card reviewed longer ago needs 'stale_ok: <reason>'.",
)
@common
@handled
def lint_cmd(store: Path, as_json: bool, cards_dir: Path | None, max_age_days: int) -> Outcome:
    """Check the cards: valid, https sources, unique ids, reviewed within the age limit (exit 1 on any problem)."""
    directory = cards_dir or kb.default_cards_dir()
    report = kb.lint(directory, max_age_days=max_age_days)
    doc = report.to_json()
    doc["cards_dir"] = str(directory)
    return Outcome(
        doc=doc, human=_render_lint(report, directory), exit_code=Exit.DONE if report.ok else Exit.FAILED
    )


commands = [knowledge]
