"""Version numbers and version specifiers, without a dependency on `packaging`.

A version is PEP 440 shaped: a release (`2.11.0`, `580.159.04`, `2025.3.1.0`), an optional
pre-release (`a1`, `b2`, `rc1`), post-release (`.post1`) and development release (`.dev20250101`),
and an optional local label (`+cu130`, `+git1234`). The local label never takes part in a
comparison: `2.11.0+cu130` compares as `2.11.0`. Release segments compare numerically, so
`580.159.04` equals `580.159.4` and `2.10` is newer than `2.9`.

A specifier is a comma-separated list of clauses that must all hold: `>=2.2,<3`, `==2.5.*`,
`!=3.0.0`, `~=2.2`. A clause is an operator (`==`, `!=`, `>=`, `<=`, `>`, `<`, `~=`) and a version;
`==` and `!=` accept a trailing `.*` (prefix match).

A pre-release or development build is judged twice, as itself and as the release it leads to
(`2.6.0a0` and `2.6.0`); when the two answers differ the answer is unknown (`None`), because such a
build may or may not carry what the release carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION_RE = re.compile(
    r"""
    ^\s*v?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$
    """,
    re.VERBOSE | re.IGNORECASE,
)

_PRE_PHASE = {"a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3, "preview": 3}


class VersionError(ValueError):
    """A version or specifier that cannot be parsed."""


@dataclass(frozen=True)
class Version:
    release: tuple[int, ...]
    pre: tuple[int, int] | None = None  # (phase, number); phase a=1, b=2, rc=3
    post: int | None = None
    dev: int | None = None
    local: str | None = None
    text: str = ""

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def base(self) -> Version:
        """The release this version leads to, or is (no pre, post, dev or local part)."""
        return Version(release=self.release, text=".".join(str(p) for p in self.release))

    def _key(self) -> tuple[tuple[int, ...], tuple[int, int], int, tuple[int, int]]:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is not None:
            pre = self.pre
        elif self.post is None and self.dev is not None:
            pre = (0, 0)  # 1.0.dev1 sorts before 1.0a1
        else:
            pre = (4, 0)
        post = -1 if self.post is None else self.post
        dev = (1, 0) if self.dev is None else (0, self.dev)
        return (tuple(release), pre, post, dev)

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Version) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Version) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Version) -> bool:
        return self._key() >= other._key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text


def parse_version(text: str) -> Version:
    """Parse a version string; raise VersionError when it is not one."""
    if not isinstance(text, str):
        raise VersionError(f"not a version: {text!r}")
    m = _VERSION_RE.match(text)
    if not m:
        raise VersionError(f"not a version: {text!r}")
    release = tuple(int(p) for p in m.group("release").split("."))
    pre = None
    if m.group("pre_l"):
        pre = (_PRE_PHASE[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post_n1") is not None:
        post = int(m.group("post_n1"))
    elif m.group("post_l"):
        post = int(m.group("post_n2") or 0)
    dev = None
    if m.group("dev_l"):
        dev = int(m.group("dev_n") or 0)
    return Version(release=release, pre=pre, post=post, dev=dev, local=m.group("local"), text=text.strip())


_CLAUSE_RE = re.compile(r"^\s*(?P<op>==|!=|>=|<=|~=|>|<)\s*(?P<ver>[^\s,]+)\s*$")


@dataclass(frozen=True)
class Clause:
    op: str
    version: Version
    wildcard: bool = False  # `==2.5.*`: prefix match on the release

    def holds(self, v: Version) -> bool:
        if self.wildcard:
            prefix = self.version.release
            padded = v.release + (0,) * max(0, len(prefix) - len(v.release))
            match = padded[: len(prefix)] == prefix
            return match if self.op == "==" else not match
        if self.op == "==":
            return v == self.version
        if self.op == "!=":
            return v != self.version
        if self.op == ">=":
            return v >= self.version
        if self.op == "<=":
            return v <= self.version
        if self.op == ">":
            return v > self.version
        if self.op == "<":
            return v < self.version
        # ~=X.Y[.Z]: >= X.Y[.Z] and the same release up to the last-but-one segment
        prefix = self.version.release[:-1]
        padded = v.release + (0,) * max(0, len(prefix) - len(v.release))
        return v >= self.version and padded[: len(prefix)] == prefix

    def __str__(self) -> str:
        return f"{self.op}{self.version.text}{'.*' if self.wildcard else ''}"


@dataclass(frozen=True)
class Spec:
    clauses: tuple[Clause, ...]
    text: str

    def contains(self, v: Version) -> bool | None:
        """True or False; None when a pre-release build and its release disagree."""
        full = all(c.holds(v) for c in self.clauses)
        if not v.is_prerelease:
            return full
        base = all(c.holds(v.base) for c in self.clauses)
        return full if full == base else None

    def __str__(self) -> str:
        return self.text


def parse_spec(text: str) -> Spec:
    """Parse `>=2.2,<3` style specifiers; raise VersionError on anything else."""
    if not isinstance(text, str) or not text.strip():
        raise VersionError(f"empty version specifier: {text!r}")
    clauses = []
    for part in text.split(","):
        m = _CLAUSE_RE.match(part)
        if not m:
            raise VersionError(
                f"bad clause {part.strip()!r} in {text!r} (expected e.g. '>=2.2' or '==2.5.*')"
            )
        op, ver = m.group("op"), m.group("ver")
        wildcard = False
        if ver.endswith(".*"):
            if op not in ("==", "!="):
                raise VersionError(f"'.*' is only allowed with == or != (in {text!r})")
            wildcard = True
            ver = ver[:-2]
        version = parse_version(ver)
        if wildcard and (version.is_prerelease or version.post is not None or version.local):
            raise VersionError(f"a wildcard clause takes a plain release (in {text!r})")
        if op == "~=" and len(version.release) < 2:
            raise VersionError(f"~= needs at least two release segments (in {text!r})")
        clauses.append(Clause(op=op, version=version, wildcard=wildcard))
    return Spec(clauses=tuple(clauses), text=",".join(str(c) for c in clauses))
