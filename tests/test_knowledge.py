"""Knowledge cards: model, version/arch comparison, identity-aware query, lint, CLI."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cko_perf import knowledge
from cko_perf.knowledge.arch import ArchError, parse_arch, parse_device_arch
from cko_perf.knowledge.loader import CardSetError, lint, load_cards
from cko_perf.knowledge.query import (
    Identity,
    IdentityError,
    identity_from_target_doc,
    make_identity,
    parse_lib_options,
    query,
)
from cko_perf.knowledge.versions import VersionError, parse_spec, parse_version
from cko_perf.runner.cli import cli

H200 = {"torch": "2.11.0+cu130", "triton": "3.6.0", "ncu": "2025.3.1"}


def by_id(answer: knowledge.Answer) -> dict[str, knowledge.Result]:
    return {r.card.id: r for r in answer.results}


@pytest.fixture(scope="module")
def cards() -> list[knowledge.Card]:
    return load_cards()


@pytest.fixture(scope="module")
def h200(cards: list[knowledge.Card]) -> dict[str, knowledge.Result]:
    ident = make_identity(arch="sm_90", driver="580.159.04", cuda="13.0", libs=H200)
    return by_id(query(ident, cards=cards))


@pytest.fixture(scope="module")
def a100(cards: list[knowledge.Card]) -> dict[str, knowledge.Result]:
    ident = make_identity(arch="sm_80", driver="535.104.05", cuda="12.2", libs={"torch": "2.3.1"})
    return by_id(query(ident, cards=cards))


@pytest.fixture(scope="module")
def unknown_gpu(cards: list[knowledge.Card]) -> dict[str, knowledge.Result]:
    return by_id(query(Identity(), cards=cards))


# ---------------------------------------------------------------------------------------------
# versions and architectures


def test_local_version_compares_as_release() -> None:
    assert parse_version("2.11.0+cu130") == parse_version("2.11.0")
    assert parse_version("2.11") == parse_version("2.11.0")
    assert parse_spec(">=2.9").contains(parse_version("2.11.0+cu130")) is True
    assert parse_spec("==2.11.0").contains(parse_version("2.11.0+cu130")) is True


def test_release_segments_compare_numerically() -> None:
    assert parse_version("2.10.0") > parse_version("2.9.1")
    assert parse_version("580.159.04") > parse_version("580.65.06")
    assert parse_version("580.159.04") == parse_version("580.159.4")
    assert parse_version("2025.3.1") > parse_version("2024.3.2")


def test_prerelease_ordering() -> None:
    order = ["1.0.dev1", "1.0a1", "1.0b2", "1.0rc1", "1.0", "1.0.post1", "1.0.1"]
    versions = [parse_version(v) for v in order]
    assert versions == sorted(versions)
    assert all(a < b for a, b in zip(versions, versions[1:], strict=False))


def test_prerelease_builds_are_undecided_at_the_boundary() -> None:
    # A 2.6 nightly may or may not carry what 2.6 carries: unknown, not a silent yes or no.
    assert parse_spec(">=2.6").contains(parse_version("2.6.0a0+git1234")) is None
    assert parse_spec("<2.6").contains(parse_version("2.6.0.dev20250101")) is None
    # Far from the boundary the answer is clear.
    assert parse_spec(">=2.2").contains(parse_version("2.6.0a0")) is True
    assert parse_spec("<2.2").contains(parse_version("2.6.0a0")) is False


def test_spec_forms() -> None:
    assert parse_spec(">=2.2,<3").contains(parse_version("2.9")) is True
    assert parse_spec(">=2.2,<3").contains(parse_version("3.0")) is False
    assert parse_spec("==2.5.*").contains(parse_version("2.5.1")) is True
    assert parse_spec("==2.5.*").contains(parse_version("2.6.0")) is False
    assert parse_spec("!=3.0.0").contains(parse_version("3.0")) is False
    assert parse_spec("~=2.2").contains(parse_version("2.9.3")) is True
    assert parse_spec("~=2.2").contains(parse_version("3.0")) is False
    assert parse_spec(" >= 12.8 ").contains(parse_version("13.0")) is True


@pytest.mark.parametrize("bad", ["", "2.2", ">=", ">=two", "=>2.2", ">=2.*", "~=2", ">=2.2;<3"])
def test_bad_specs_are_refused(bad: str) -> None:
    with pytest.raises(VersionError):
        parse_spec(bad)


@pytest.mark.parametrize("bad", ["", "latest", "2.x", "v", "1..2"])
def test_bad_versions_are_refused(bad: str) -> None:
    with pytest.raises(VersionError):
        parse_version(bad)


def test_arch_targets_cover_devices() -> None:
    sm90, sm100, sm103, sm120 = (parse_device_arch(a) for a in ("sm_90", "sm_100", "sm_103", "sm_120"))
    assert parse_arch("sm_90a").covers(sm90)
    assert not parse_arch("sm_90a").covers(sm100)  # 'a' code never runs on a later architecture
    assert parse_arch("sm_100f").covers(sm100) and parse_arch("sm_100f").covers(sm103)
    assert not parse_arch("sm_100f").covers(sm120) and not parse_arch("sm_100f").covers(sm90)
    assert parse_arch("sm_89").covers(parse_device_arch("8.9"))
    assert parse_device_arch("9.0") == parse_device_arch("sm_90")
    assert parse_device_arch("sm_90a").device == "sm_90"


@pytest.mark.parametrize("bad", ["foo", "sm_9", "sm_90x", "compute_90", "90", "sm_100f"])
def test_bad_device_archs_are_refused(bad: str) -> None:
    with pytest.raises(ArchError):
        parse_device_arch(bad)


# ---------------------------------------------------------------------------------------------
# the bundled cards


def test_bundled_cards_pass_lint() -> None:
    report = lint()
    assert report.ok, [str(p) for p in report.problems]
    assert report.cards >= 90
    assert report.contracts >= 25


def test_cards_cover_the_four_architectures(cards: list[knowledge.Card]) -> None:
    for arch in ("sm_80", "sm_89", "sm_90", "sm_100"):
        ident = make_identity(arch=arch)
        arch_cards = [
            r
            for r in query(ident, cards=cards).results
            if any(c.name in ("arch", "min_arch", "max_arch") and c.status == "pass" for c in r.conditions)
        ]
        assert len(arch_cards) >= 10, arch


def test_every_card_has_a_check_and_a_sourced_statement(cards: list[knowledge.Card]) -> None:
    for card in cards:
        assert card.check.how
        assert all(s.url.startswith("https://") and s.section and s.supports for s in card.sources)


def test_schema_is_closed() -> None:
    schema = knowledge.schema()
    assert schema["additionalProperties"] is False
    assert {"id", "kind", "statement", "applies_when", "sources", "last_reviewed", "check"} <= set(
        schema["properties"]
    )
    assert schema["$defs"]["Conditions"]["additionalProperties"] is False


# ---------------------------------------------------------------------------------------------
# classification


def test_h200_wgmma_applies_because_sm90_runs_sm90a_code(h200: dict[str, knowledge.Result]) -> None:
    r = h200["wgmma-requires-sm90a"]
    assert r.classification == "applies"
    assert "arch sm_90 in [sm_90a]" in r.reason


def test_h200_blackwell_cards_do_not_apply(h200: dict[str, knowledge.Result]) -> None:
    r = h200["tcgen05-blackwell-datacenter"]
    assert r.classification == "does_not_apply"
    assert r.reason == "arch sm_90 not in [sm_100f, sm_110f]"
    assert h200["shared-memory-capacity-sm80"].reason == "arch sm_90 not in [sm_80]"


def test_h200_version_conditions(h200: dict[str, knowledge.Result]) -> None:
    assert h200["torch-fp32-precision-api"].classification == "applies"
    old = h200["torch-tf32-flags-before-2-9"]
    assert old.classification == "does_not_apply"
    assert "torch 2.11.0+cu130 not in >=1.12,<2.9" in old.reason
    assert h200["cuda13-drops-maxwell-pascal-volta"].classification == "applies"
    assert h200["lazy-loading-default"].classification == "applies"
    assert h200["triton-dot-input-precision"].classification == "applies"
    assert h200["shared-memory-capacity-sm90"].classification == "applies"


def test_h200_unknown_library_is_related_not_applies(h200: dict[str, knowledge.Result]) -> None:
    r = h200["cutlass-hopper-needs-sm90a"]  # the identity says nothing about CUTLASS
    assert r.classification == "related"
    assert "cutlass version unknown; card needs >=3.0" in r.reason


def test_a100_wgmma_does_not_apply_and_names_the_condition(a100: dict[str, knowledge.Result]) -> None:
    r = a100["wgmma-requires-sm90a"]
    assert r.classification == "does_not_apply"
    assert r.reason == "arch sm_80 not in [sm_90a]"
    fp8 = a100["fp8-mma-sm89"]
    assert fp8.classification == "does_not_apply"
    assert fp8.reason == "arch sm_80 below min_arch sm_89"
    assert a100["cp-async-sm80"].classification == "applies"
    assert a100["shared-memory-capacity-sm80"].classification == "applies"
    assert a100["torch-tf32-flags-before-2-9"].classification == "applies"
    assert a100["cuda13-drops-maxwell-pascal-volta"].reason == "cuda 12.2 not in >=13.0"


def test_unknown_gpu_never_applies_arch_cards(unknown_gpu: dict[str, knowledge.Result]) -> None:
    r = unknown_gpu["wgmma-requires-sm90a"]
    assert r.classification == "related"
    assert r.reason == "arch unknown; card needs one of [sm_90a]"
    # A card without conditions holds everywhere.
    assert unknown_gpu["ncu-clock-control-base"].classification == "applies"
    for res in unknown_gpu.values():
        if res.card.applies_when.is_empty():
            assert res.classification == "applies"
        else:
            assert res.classification == "related", res.card.id  # nothing is known, nothing fails


def test_unknown_condition_is_never_applies(cards: list[knowledge.Card]) -> None:
    # Only the arch is known: every card that also needs a driver, CUDA or library version is
    # related (or does not apply because the arch fails), never applies.
    answer = query(make_identity(arch="sm_90"), cards=cards)
    checked = 0
    for r in answer.results:
        c = r.card.applies_when
        if c.libs or c.cuda or c.min_driver:
            checked += 1
            assert r.classification != "applies", r.card.id
            if r.classification == "related":
                assert "unknown" in r.reason
    assert checked >= 20


def test_prerelease_torch_makes_boundary_cards_related(cards: list[knowledge.Card]) -> None:
    answer = by_id(query(make_identity(arch="sm_90", libs={"torch": "2.9.0a0+gitabc"}), cards=cards))
    assert answer["torch-fp32-precision-api"].classification == "related"
    assert "pre-release" in answer["torch-fp32-precision-api"].reason
    assert answer["torch-tf32-flags-before-2-9"].classification == "related"


def test_blackwell_identities(cards: list[knowledge.Card]) -> None:
    b200 = by_id(query(make_identity(arch="sm_100", cuda="12.9"), cards=cards))
    assert b200["tcgen05-blackwell-datacenter"].classification == "applies"
    assert b200["wgmma-requires-sm90a"].reason == "arch sm_100 not in [sm_90a]"
    assert b200["family-specific-targets-sm100f"].classification == "applies"
    rtx = by_id(query(make_identity(arch="sm_120", cuda="12.9"), cards=cards))
    assert rtx["tcgen05-blackwell-datacenter"].classification == "does_not_apply"
    assert rtx["blackwell-needs-cuda-12-8"].classification == "applies"
    assert rtx["family-specific-targets-sm100f"].reason == "arch sm_120 not in [sm_100f]"


def test_sm90a_identity_is_the_sm90_device(cards: list[knowledge.Card]) -> None:
    a = by_id(query(make_identity(arch="sm_90a"), cards=cards))
    b = by_id(query(make_identity(arch="sm_90"), cards=cards))
    assert {k: r.classification for k, r in a.items()} == {k: r.classification for k, r in b.items()}


def test_results_are_sorted(cards: list[knowledge.Card]) -> None:
    results = query(make_identity(arch="sm_90", libs={"torch": "2.11.0"}), cards=cards).results
    rank = {"applies": 0, "related": 1, "does_not_apply": 2}
    keys = [(rank[r.classification], 0 if r.card.kind == "contract" else 1, r.card.id) for r in results]
    assert keys == sorted(keys)
    assert {r.classification for r in results} == {"applies", "related", "does_not_apply"}
    assert len(results) == len(cards)  # every card is classified


def test_topic_filter(cards: list[knowledge.Card]) -> None:
    answer = query(make_identity(arch="sm_90"), ["profiling"], cards=cards)
    for r in answer.results:
        if "profiling" in r.card.topics:
            assert not r.outside_topics
        else:
            assert r.classification == "does_not_apply" and r.outside_topics
            assert "include none of [profiling]" in r.reason
    assert any(r.classification == "applies" for r in answer.results)
    with pytest.raises(IdentityError) as err:
        query(make_identity(), ["nonsense"], cards=cards)
    assert err.value.field == "--topic"


def test_empty_answer_says_nothing_matched() -> None:
    answer = query(make_identity(arch="sm_90"), cards=[])
    assert answer.nothing_matched
    assert answer.message().startswith("nothing matched")
    assert answer.to_json()["cards"] == []


def test_lib_option_parsing() -> None:
    assert parse_lib_options(["torch=2.11.0+cu130", "Triton=3.6.0"]) == {
        "torch": "2.11.0+cu130",
        "triton": "3.6.0",
    }
    for bad in (["torch"], ["torch="], ["=2.0"], ["torch=latest"]):
        with pytest.raises(IdentityError) as err:
            parse_lib_options(bad)
        assert err.value.field == "--lib"


# ---------------------------------------------------------------------------------------------
# identity from a Target record


def target_doc(**identity: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "devices": [{"index": 0, "uuid": "GPU-x", "name": "NVIDIA H200", "compute_capability": "9.0"}],
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
        "tools": {
            "torch": "2.11.0+cu130",
            "triton": "3.6.0",
            "nvcc": "13.0",
            "ncu": "2025.3.1",
            "python": "3.12.3",
        },
    }
    base.update(identity)
    return {"id": "t-1", "identity": base}


def test_identity_from_target_doc() -> None:
    ident = identity_from_target_doc(target_doc())
    assert str(ident.arch) == "sm_90"
    assert ident.driver == "580.159.04"
    assert ident.cuda == "13.0" and ident.origin["cuda"] == "identity.tools.nvcc"
    assert ident.cuda_driver == "13.0"
    assert ident.libs["torch"] == "2.11.0+cu130"
    assert ident.origin["arch"] == "identity.devices[0].compute_capability"


def test_identity_from_target_doc_without_devices_or_tools() -> None:
    ident = identity_from_target_doc(target_doc(devices=[], tools={"weird": "not a version"}))
    assert ident.arch is None and ident.cuda is None and ident.libs == {}
    # cuda_driver_version is the driver's ceiling, not the toolkit in use
    assert ident.cuda_driver == "13.0"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"id": "t"}, "identity"),
        (target_doc(devices=[{"compute_capability": "nine"}]), "identity.devices[0].compute_capability"),
        (target_doc(driver_version="r580"), "identity.driver_version"),
        (target_doc(tools=["torch"]), "identity.tools"),
    ],
)
def test_identity_from_target_doc_errors_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(IdentityError) as err:
        identity_from_target_doc(doc)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# lint on a hostile card set

GOOD_CARD = """\
- id: {id}
  title: A valid card
  kind: {kind}
  statement: Something documented that holds on sm_90 devices.
  applies_when:
    archs: [sm_90]
  topics: [memory]
  sources:
    - title: CUDA C++ Programming Guide
      url: {url}
      section: Some section
      supports: the statement
  last_reviewed: {date}
  check:
    how: Look at the SASS for the instruction.
{extra}"""


def write_card(
    path: Path,
    *,
    id: str = "ok-card",
    kind: str = "contract",
    url: str = "https://docs.nvidia.com/cuda/x.html",
    date: str = "2026-11-01",
    extra: str = "",
) -> None:
    path.write_text(GOOD_CARD.format(id=id, kind=kind, url=url, date=date, extra=extra))


def test_lint_reports_every_problem_of_a_hostile_set(tmp_path: Path) -> None:
    write_card(tmp_path / "a.yaml", id="dup-card")
    write_card(tmp_path / "b.yaml", id="dup-card")
    write_card(tmp_path / "c.yaml", id="bad-url", url="http://docs.nvidia.com/x")
    write_card(tmp_path / "d.yaml", id="no-host", url="https:///path-only")
    write_card(tmp_path / "e.yaml", id="unknown-field", extra="  flavour: spicy\n")
    write_card(tmp_path / "f.yaml", id="bad-date", date="2025-13-45")
    write_card(tmp_path / "g.yaml", id="stale-card", date="2023-01-01")
    write_card(
        tmp_path / "h.yaml",
        id="stale-but-flagged",
        date="2023-01-01",
        extra="  stale_ok: hardware fact, unchanged\n",
    )
    write_card(tmp_path / "i.yaml", id="future-card", date="2027-06-01")
    write_card(tmp_path / "j.yaml", id="blog-contract", url="https://example.com/a-blog-post")
    write_card(
        tmp_path / "k.yaml", id="blog-heuristic", kind="heuristic", url="https://example.com/a-blog-post"
    )
    (tmp_path / "l.yaml").write_text("id: not-a-list\n")
    (tmp_path / "m.yaml").write_text("- id: dup-key\n  id: dup-key-again\n")
    (tmp_path / "n.yaml").write_text(
        textwrap.dedent(
            """\
            - id: bad-arch
              title: Bad arch
              kind: contract
              statement: A card with an architecture that does not exist.
              applies_when: {archs: [sm_9x], libs: {torch: "2.2"}}
              topics: [memory, not-a-topic]
              sources: [{title: T, url: "https://docs.nvidia.com/x", section: S, supports: nothing much}]
              last_reviewed: 2026-11-01
              check: {how: nothing to check here}
            """
        )
    )
    report = lint(tmp_path, today=dt.date(2026, 12, 2))
    assert not report.ok
    problems = [(p.file, p.card, p.field, p.message) for p in report.problems]

    def has(card: str, field: str | None, text: str) -> bool:
        return any(c == card and (field is None or f == field) and text in m for _, c, f, m in problems)

    assert has("dup-card", "id", "duplicate id (also in a.yaml)")
    assert has("bad-url", "sources.0.url", "must use https")
    assert has("no-host", "sources.0.url", "no valid host")
    assert has("unknown-field", "flavour", "Extra inputs are not permitted")
    assert has("bad-date", "last_reviewed", "not a calendar date")
    assert has("stale-card", "last_reviewed", "stale_ok")
    assert not has("stale-but-flagged", None, "")
    assert has("future-card", "last_reviewed", "in the future")
    assert has("blog-contract", "sources", "primary source")
    assert not has("blog-heuristic", None, "")
    assert any(f == "l.yaml" and "YAML list" in m for f, _, _, m in problems)
    assert any(f == "m.yaml" and "duplicate key" in m for f, _, _, m in problems)
    assert has("bad-arch", "applies_when.archs", "not an architecture")
    assert has("bad-arch", "applies_when.libs", "bad clause")
    assert has("bad-arch", "topics.1", "")
    with pytest.raises(CardSetError):
        load_cards(tmp_path)


def test_lint_of_a_clean_set_passes(tmp_path: Path) -> None:
    write_card(tmp_path / "one.yaml", id="first-card")
    write_card(tmp_path / "two.yaml", id="second-card", kind="heuristic")
    report = lint(tmp_path, today=dt.date(2026, 12, 2))
    assert report.ok and report.cards == 2 and report.contracts == 1
    assert [c.id for c in load_cards(tmp_path)] == ["first-card", "second-card"]


def test_lint_of_a_missing_directory(tmp_path: Path) -> None:
    report = lint(tmp_path / "absent")
    assert not report.ok and "does not exist" in report.problems[0].message


# ---------------------------------------------------------------------------------------------
# CLI


def run_cli(*args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, list(args))
    out = result.stdout
    return result.exit_code, (json.loads(out) if "--json" in args and out.strip() else out)


def test_cli_query_json() -> None:
    code, doc = run_cli(
        "knowledge",
        "query",
        "--arch",
        "sm_90",
        "--driver",
        "580.159.04",
        "--cuda",
        "13.0",
        "--lib",
        "torch=2.11.0",
        "--json",
    )
    assert code == 0
    assert doc["identity"]["arch"] == "sm_90" and doc["identity"]["libs"] == {"torch": "2.11.0"}
    assert doc["counts"]["total"] == len(doc["cards"]) >= 90
    first = doc["cards"][0]
    assert {"id", "classification", "reason", "kind", "title", "statement", "sources", "check"} <= set(first)
    wgmma = next(c for c in doc["cards"] if c["id"] == "wgmma-requires-sm90a")
    assert wgmma["classification"] == "applies"


def test_cli_query_human_table() -> None:
    code, out = run_cli("knowledge", "query", "--arch", "sm_80", "--topic", "tensor-cores")
    assert code == 0
    assert "wgmma-requires-sm90a" in out and "arch sm_80 not in [sm_90a]" in out
    assert "outside the topic filter" in out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--arch", "foo"], "--arch"),
        (["--lib", "torch"], "--lib"),
        (["--driver", "r580"], "--driver"),
        (["--cuda", "thirteen"], "--cuda"),
        (["--topic", "nonsense"], "--topic"),
    ],
)
def test_cli_query_bad_input_exits_2_naming_the_option(args: list[str], field: str) -> None:
    code, doc = run_cli("knowledge", "query", *args, "--json")
    assert code == 2
    assert doc["field"] == field and doc["exit_code"] == 2


def test_cli_query_empty_answer_is_exit_0(tmp_path: Path) -> None:
    write_card(tmp_path / "only.yaml", id="hopper-only")
    code, doc = run_cli("knowledge", "query", "--arch", "sm_80", "--cards-dir", str(tmp_path), "--json")
    assert code == 0
    assert doc["counts"] == {"applies": 0, "related": 0, "does_not_apply": 1, "total": 1}
    assert doc["message"].startswith("nothing matched")
    assert doc["cards"][0]["reason"] == "arch sm_80 not in [sm_90]"


def test_cli_query_from_target(tmp_path: Path) -> None:
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "t-1.json").write_text(json.dumps(target_doc()))
    code, doc = run_cli("knowledge", "query", "--store", str(tmp_path), "--from-target", "t-1", "--json")
    assert code == 0
    assert doc["from_target"] == "t-1"
    assert doc["identity"]["arch"] == "sm_90" and doc["identity"]["cuda"] == "13.0"
    assert doc["identity"]["origin"]["libs.triton"] == "identity.tools.triton"
    cards = {c["id"]: c for c in doc["cards"]}
    assert cards["wgmma-requires-sm90a"]["classification"] == "applies"
    assert cards["triton-dot-input-precision"]["classification"] == "applies"
    assert cards["torch-tf32-flags-before-2-9"]["classification"] == "does_not_apply"
    # An explicit option overrides the frozen identity.
    code, doc = run_cli(
        "knowledge", "query", "--store", str(tmp_path), "--from-target", "t-1", "--arch", "sm_80", "--json"
    )
    assert code == 0 and doc["identity"]["arch"] == "sm_80" and doc["identity"]["origin"]["arch"] == "--arch"


@pytest.mark.parametrize(
    ("target_id", "content", "field"),
    [
        ("missing", None, "--from-target"),
        ("../escape", None, "--from-target"),
        ("broken", "{not json", "--from-target"),
        ("no-identity", json.dumps({"id": "no-identity"}), "identity"),
        (
            "bad-cc",
            json.dumps(target_doc(devices=[{"compute_capability": "9"}])),
            "identity.devices[0].compute_capability",
        ),
    ],
)
def test_cli_query_from_target_errors(
    tmp_path: Path, target_id: str, content: str | None, field: str
) -> None:
    (tmp_path / "targets").mkdir()
    if content is not None:
        (tmp_path / "targets" / f"{target_id}.json").write_text(content)
    code, doc = run_cli("knowledge", "query", "--store", str(tmp_path), "--from-target", target_id, "--json")
    assert code == 2
    assert doc["field"] == field


def test_cli_lint_real_cards() -> None:
    code, doc = run_cli("knowledge", "lint", "--json")
    assert code == 0
    assert doc["ok"] is True and doc["problems"] == [] and doc["cards"] >= 90


def test_cli_lint_hostile_cards_exit_1(tmp_path: Path) -> None:
    write_card(tmp_path / "a.yaml", id="same")
    write_card(tmp_path / "b.yaml", id="same", url="ftp://docs.nvidia.com/x")
    code, doc = run_cli("knowledge", "lint", "--cards-dir", str(tmp_path), "--json")
    assert code == 1
    assert doc["ok"] is False
    fields = {(p.get("card"), p.get("field")) for p in doc["problems"]}
    assert ("same", "sources.0.url") in fields and (
        "same",
        "id",
    ) not in fields  # b is invalid, so no duplicate
    code, out = run_cli("knowledge", "lint", "--cards-dir", str(tmp_path))
    assert code == 1 and "must use https" in out


def test_cli_query_invalid_card_set_is_reported(tmp_path: Path) -> None:
    write_card(tmp_path / "a.yaml", id="bad", url="http://x.org")
    code, doc = run_cli("knowledge", "query", "--cards-dir", str(tmp_path), "--json")
    assert code == 1
    assert doc["error"] == "invalid_cards" and doc["detail"]["problems"]


def test_card_checks_name_facts_the_parsers_produce_from_real_reports() -> None:
    """Every `check.facts` entry is a field the parser fills from a real report (the H200 trace and
    the nsys fixture), and a name no parser produces is refused by the model."""
    from pydantic import ValidationError

    from cko_perf.knowledge.loader import read_cards
    from cko_perf.knowledge.model import Check
    from cko_perf.operations.evidence.nsys import parse_nsys_sqlite
    from cko_perf.operations.evidence.torch_trace import parse_torch_trace

    fix = Path(__file__).parent / "fixtures"
    parsed = {
        "torch": parse_torch_trace(fix / "torch" / "torch_trace.json").model_dump(),
        "nsys": parse_nsys_sqlite(fix / "nsys" / "torch_like_export.sqlite").model_dump(),
    }
    cards, problems = read_cards(None)
    assert not problems
    named = sorted({f for _, c in cards for f in c.check.facts})
    checked = [f for f in named if f.split(".")[0] in parsed]
    empty = [f for f in checked if not parsed[f.split(".")[0]][f.split(".", 1)[1]]]
    assert len(checked) >= 6 and not empty, (checked, empty)
    for bad in ("torch.kernel_time_total", "perf.kernels", "torch"):
        with pytest.raises(ValidationError, match="fact"):
            Check(how="look at the trace for it", facts=[bad])
