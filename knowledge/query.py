"""Classify every card against an identity: `applies`, `related` or `does_not_apply`.

- `does_not_apply`: a condition fails (the reason names it: `arch sm_80 not in [sm_90a]`), or a
  topic filter was given and the card has none of its topics.
- `related`: no condition fails but at least one cannot be decided because the identity does not
  say (no arch, no torch version, a pre-release build...). Such a card is never `applies`.
- `applies`: every condition holds (a card without conditions holds everywhere).

Results are sorted: applies, related, does_not_apply; within each, contract cards first, then by id.
An empty answer is an answer: nothing here ever blocks anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .arch import Arch, ArchError, from_compute_capability, parse_arch, parse_device_arch
from .loader import load_cards
from .model import TOPICS, Card
from .versions import VersionError, parse_spec, parse_version

Classification = Literal["applies", "related", "does_not_apply"]
_RANK = {"applies": 0, "related": 1, "does_not_apply": 2}
_TARGET_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class IdentityError(ValueError):
    """Bad identity input; `field` names the option or record field at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Identity:
    """What is known about the environment. None (or a missing library) means unknown."""

    arch: Arch | None = None
    driver: str | None = None
    cuda: str | None = None  # CUDA toolkit/runtime in use (the `cuda` card condition)
    cuda_driver: str | None = None  # highest CUDA version the driver supports (shown, not a condition)
    libs: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # field -> where the value came from

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": str(self.arch) if self.arch else None,
            "driver": self.driver,
            "cuda": self.cuda,
            "cuda_driver": self.cuda_driver,
            "libs": dict(sorted(self.libs.items())),
            "origin": dict(sorted(self.origin.items())),
        }


@dataclass(frozen=True)
class Condition:
    name: str
    status: Literal["pass", "fail", "unknown"]
    detail: str


@dataclass(frozen=True)
class Result:
    card: Card
    classification: Classification
    reason: str
    conditions: list[Condition]
    outside_topics: bool = False  # the card has none of the requested topics

    def to_json(self) -> dict[str, Any]:
        c = self.card
        return {
            "id": c.id,
            "classification": self.classification,
            "reason": self.reason,
            "kind": c.kind,
            "title": c.title,
            "statement": c.statement,
            "topics": list(c.topics),
            "applies_when": c.applies_when.model_dump(exclude_defaults=True),
            "conditions": [{"name": x.name, "status": x.status, "detail": x.detail} for x in self.conditions],
            "sources": [s.model_dump() for s in c.sources],
            "check": c.check.model_dump(exclude_defaults=True),
            "last_reviewed": c.last_reviewed.isoformat(),
        }


# ---------------------------------------------------------------------------------------------
# identity input


def _check_version(value: str, what: str) -> str:
    try:
        parse_version(value)
    except VersionError:
        raise IdentityError(
            f"{what}: {value!r} is not a version (expected e.g. 2.11.0)", field=what
        ) from None
    return value.strip()


def parse_lib_options(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`NAME=VERSION` strings (the --lib option) to a dict; raise IdentityError naming --lib."""
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise IdentityError(f"--lib {item!r}: expected NAME=VERSION, e.g. torch=2.11.0", field="--lib")
        name, _, version = item.partition("=")
        name = name.strip().lower()
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
            raise IdentityError(f"--lib {item!r}: bad library name {name!r}", field="--lib")
        if not version.strip():
            raise IdentityError(f"--lib {item!r}: the version is empty", field="--lib")
        _check_version(version, "--lib")
        out[name] = version.strip()
    return out


def make_identity(
    *,
    arch: str | None = None,
    driver: str | None = None,
    cuda: str | None = None,
    libs: dict[str, str] | None = None,
    base: Identity | None = None,
) -> Identity:
    """An identity from explicit values; given values override `base` (e.g. one from a Target)."""
    base = base or Identity()
    origin = dict(base.origin)
    out_arch = base.arch
    if arch is not None:
        try:
            out_arch = parse_device_arch(arch)
        except ArchError as exc:
            raise IdentityError(f"--arch: {exc}", field="--arch") from None
        origin["arch"] = "--arch"
    out_driver = base.driver
    if driver is not None:
        out_driver = _check_version(driver, "--driver")
        origin["driver"] = "--driver"
    out_cuda = base.cuda
    if cuda is not None:
        out_cuda = _check_version(cuda, "--cuda")
        origin["cuda"] = "--cuda"
    out_libs = dict(base.libs)
    for name, version in (libs or {}).items():
        out_libs[name.lower()] = _check_version(version, "--lib")
        origin[f"libs.{name.lower()}"] = "--lib"
    return Identity(
        arch=out_arch,
        driver=out_driver,
        cuda=out_cuda,
        cuda_driver=base.cuda_driver,
        libs=out_libs,
        origin=origin,
    )


def identity_from_target_doc(doc: Any) -> Identity:
    """The identity frozen in a Target record (its `identity` field, runner.identity shape).

    Reads `identity.devices[0].compute_capability`, `identity.driver_version`, `identity.tools`
    (the CUDA version is `tools.nvcc`, else `tools.cuda`) and `identity.cuda_driver_version`. The
    latter is the highest CUDA version the driver supports, not the toolkit in use, so it is
    reported as `cuda_driver` and never taken for the `cuda` condition.
    """
    if not isinstance(doc, dict):
        raise IdentityError("target record is not a JSON object", field="identity")
    ident = doc.get("identity")
    if not isinstance(ident, dict):
        raise IdentityError("target record has no 'identity' object", field="identity")
    origin: dict[str, str] = {}
    arch = None
    devices = ident.get("devices")
    if devices is not None and not isinstance(devices, list):
        raise IdentityError("identity.devices is not a list", field="identity.devices")
    if devices:
        dev = devices[0]
        cc = dev.get("compute_capability") if isinstance(dev, dict) else None
        if cc is not None:
            try:
                arch = from_compute_capability(str(cc))
            except ArchError as exc:
                raise IdentityError(
                    f"identity.devices[0].compute_capability: {exc}",
                    field="identity.devices[0].compute_capability",
                ) from None
            origin["arch"] = "identity.devices[0].compute_capability"
    driver = ident.get("driver_version")
    if driver is not None:
        driver = _check_target_version(driver, "identity.driver_version")
        origin["driver"] = "identity.driver_version"
    tools = ident.get("tools") or {}
    if not isinstance(tools, dict):
        raise IdentityError("identity.tools is not an object", field="identity.tools")
    libs: dict[str, str] = {}
    for name, version in tools.items():
        if not isinstance(name, str) or not isinstance(version, str):
            continue
        try:
            parse_version(version)
        except VersionError:
            continue  # a tool whose version string is not a version stays unknown
        key = name.strip().lower()
        libs[key] = version.strip()
        origin[f"libs.{key}"] = f"identity.tools.{name}"
    cuda_driver = ident.get("cuda_driver_version")
    if cuda_driver is not None:
        cuda_driver = _check_target_version(cuda_driver, "identity.cuda_driver_version")
        origin["cuda_driver"] = "identity.cuda_driver_version"
    cuda = None
    for key in ("nvcc", "cuda"):
        if key in libs:
            cuda = libs[key]
            origin["cuda"] = f"identity.tools.{key}"
            break
    return Identity(arch=arch, driver=driver, cuda=cuda, cuda_driver=cuda_driver, libs=libs, origin=origin)


def _check_target_version(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise IdentityError(f"{where} is not a string", field=where)
    try:
        parse_version(value)
    except VersionError:
        raise IdentityError(f"{where}: {value!r} is not a version", field=where) from None
    return value.strip()


def identity_from_target(store: Path, target_id: str) -> Identity:
    """Read `<store>/targets/<id>.json` and return its identity."""
    if not isinstance(target_id, str) or not _TARGET_ID_RE.match(target_id) or ".." in target_id:
        raise IdentityError(f"--from-target: {target_id!r} is not a record id", field="--from-target")
    path = Path(store) / "targets" / f"{target_id}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise IdentityError(f"--from-target: no target record at {path}", field="--from-target") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"--from-target: cannot read {path}: {exc}", field="--from-target") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IdentityError(
            f"--from-target: {path} is not valid JSON (line {exc.lineno}: {exc.msg})", field="--from-target"
        ) from None
    return identity_from_target_doc(doc)


def check_topics(topics: list[str] | tuple[str, ...] | None) -> list[str]:
    out = []
    for t in topics or ():
        t = t.strip().lower()
        if t not in TOPICS:
            raise IdentityError(
                f"--topic {t!r}: unknown topic (one of: {', '.join(TOPICS)})", field="--topic"
            )
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# classification


def _version_condition(name: str, have: str | None, spec_text: str) -> Condition:
    spec = parse_spec(spec_text)
    if have is None:
        return Condition(name, "unknown", f"{name} version unknown; card needs {spec}")
    try:
        v = parse_version(have)
    except VersionError:
        return Condition(name, "unknown", f"{name} version {have!r} is not comparable; card needs {spec}")
    ok = spec.contains(v)
    if ok is None:
        return Condition(
            name, "unknown", f"{name} {have} is a pre-release; cannot tell whether it meets {spec}"
        )
    if ok:
        return Condition(name, "pass", f"{name} {have} in {spec}")
    return Condition(name, "fail", f"{name} {have} not in {spec}")


def evaluate(card: Card, identity: Identity) -> list[Condition]:
    """Every condition of a card, judged against the identity."""
    cond = card.applies_when
    out: list[Condition] = []
    if cond.archs:
        listed = "[" + ", ".join(cond.archs) + "]"
        if identity.arch is None:
            out.append(Condition("arch", "unknown", f"arch unknown; card needs one of {listed}"))
        elif any(parse_arch(a).covers(identity.arch) for a in cond.archs):
            out.append(Condition("arch", "pass", f"arch {identity.arch.device} in {listed}"))
        else:
            out.append(Condition("arch", "fail", f"arch {identity.arch.device} not in {listed}"))
    if cond.min_arch:
        lo = parse_arch(cond.min_arch)
        if identity.arch is None:
            out.append(Condition("min_arch", "unknown", f"arch unknown; card needs {lo} or newer"))
        elif identity.arch.cc >= lo.cc:
            out.append(Condition("min_arch", "pass", f"arch {identity.arch.device} >= {lo}"))
        else:
            out.append(Condition("min_arch", "fail", f"arch {identity.arch.device} below min_arch {lo}"))
    if cond.max_arch:
        hi = parse_arch(cond.max_arch)
        if identity.arch is None:
            out.append(Condition("max_arch", "unknown", f"arch unknown; card needs {hi} or older"))
        elif identity.arch.cc <= hi.cc:
            out.append(Condition("max_arch", "pass", f"arch {identity.arch.device} <= {hi}"))
        else:
            out.append(Condition("max_arch", "fail", f"arch {identity.arch.device} above max_arch {hi}"))
    if cond.min_driver:
        need = parse_version(cond.min_driver)
        if identity.driver is None:
            out.append(Condition("driver", "unknown", f"driver unknown; card needs {need} or newer"))
        else:
            have = parse_version(identity.driver)
            if have >= need:
                out.append(Condition("driver", "pass", f"driver {identity.driver} >= {need}"))
            else:
                out.append(Condition("driver", "fail", f"driver {identity.driver} below min_driver {need}"))
    if cond.cuda:
        out.append(_version_condition("cuda", identity.cuda, cond.cuda))
    for name, spec in sorted(cond.libs.items()):
        out.append(_version_condition(name, identity.libs.get(name), spec))
    return out


def classify(card: Card, identity: Identity, topics: list[str] | None = None) -> Result:
    conditions = evaluate(card, identity)
    fails = [c.detail for c in conditions if c.status == "fail"]
    outside = bool(topics) and not set(topics or ()) & set(card.topics)
    if outside:
        fails.append(
            f"topic: card topics [{', '.join(card.topics)}] include none of [{', '.join(topics or ())}]"
        )
    unknown = [c.detail for c in conditions if c.status == "unknown"]
    if fails:
        return Result(card, "does_not_apply", "; ".join(fails), conditions, outside_topics=outside)
    if unknown:
        return Result(card, "related", "; ".join(unknown), conditions)
    if conditions:
        reason = "all conditions hold: " + "; ".join(c.detail for c in conditions)
    else:
        reason = "no conditions: holds on every identity"
    return Result(card, "applies", reason, conditions)


def sort_key(r: Result) -> tuple[int, int, str]:
    return (_RANK[r.classification], 0 if r.card.kind == "contract" else 1, r.card.id)


@dataclass(frozen=True)
class Answer:
    identity: Identity
    topics: list[str]
    results: list[Result]

    def counts(self) -> dict[str, int]:
        out = {"applies": 0, "related": 0, "does_not_apply": 0}
        for r in self.results:
            out[r.classification] += 1
        out["total"] = len(self.results)
        return out

    @property
    def nothing_matched(self) -> bool:
        return not any(r.classification in ("applies", "related") for r in self.results)

    def message(self) -> str:
        c = self.counts()
        if self.nothing_matched:
            return (
                f"nothing matched: no card applies or relates to this identity ({c['total']} cards checked)"
            )
        return f"{c['applies']} apply, {c['related']} related, {c['does_not_apply']} do not apply ({c['total']} cards)"

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity.to_json(),
            "topics": self.topics,
            "counts": self.counts(),
            "message": self.message(),
            "cards": [r.to_json() for r in self.results],
        }


def query(
    identity: Identity,
    topics: list[str] | None = None,
    *,
    cards: list[Card] | None = None,
    cards_dir: Path | None = None,
) -> Answer:
    """Classify every card (the bundled set unless `cards` or `cards_dir` is given)."""
    topics = check_topics(topics)
    card_list = cards if cards is not None else load_cards(cards_dir)
    results = sorted((classify(c, identity, topics) for c in card_list), key=sort_key)
    return Answer(identity=identity, topics=topics, results=results)
