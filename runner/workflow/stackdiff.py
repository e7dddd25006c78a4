"""Which software components differ between two Targets (`cko audit --stack`): a pure rule over records.

A stack-upgrade audit compares two Targets that are the same workload on two stacks. It is honest
only when exactly the declared component changed: any other difference in the frozen identities
(a numpy that moved with a torch upgrade, another GPU, another kernel) would be measured along with
it and credited to the declared one. So the rule names every component that differs, refuses the
audit when one other than the declared component (and what that component implies) does, and says
`could_not_check` where an identity does not record a version, rather than assume it equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from ..errors import CkoError, Exit
from ..identity import EnvironmentIdentity
from ..models import Closed
from .records import Target

Status = Literal["differs", "equal", "could_not_check"]

# Components read from the controller's side of the identity: they belong to the host, not the image.
HOST_COMPONENTS = ("driver", "gpu", "host", "engine", "passthrough")
# Tool names the probe records that belong to a named component rather than being one of their own.
TOOL_COMPONENT = {
    "nvcc": "cuda",
    "cuda_version_env": "cuda",
    "nvidia-cuda-runtime-cu12": "cuda",
    "nvidia-cuda-runtime-cu13": "cuda",
    "nvidia-cuda-runtime": "cuda",
}
NAMED = ("driver", "cuda", "torch", "triton", "python", "image", *HOST_COMPONENTS[1:])
# A driver upgrade moves the CUDA version the driver reports along with it: that is the driver's.
IMPLIED_FACETS = {"driver": {("cuda", "cuda_driver_version")}}


class Facet(Closed):
    """One recorded value behind a component, in both identities."""

    name: str
    source: str  # where it is read: identity.tools.torch, identity.driver_version, ...
    from_value: Any = None
    to_value: Any = None
    status: Status
    note: str | None = None


class Component(Closed):
    name: str
    status: Status  # differs if any facet differs, else could_not_check if any could not be checked
    facets: list[Facet]


class DefinitionDiff(Closed):
    """A difference between the two Targets that is not the stack: the workload itself changed."""

    field: str
    why: str


class StackDiff(Closed):
    components: list[Component] = Field(default_factory=list)
    definition: list[DefinitionDiff] = Field(default_factory=list)

    def by_name(self) -> dict[str, Component]:
        return {c.name: c for c in self.components}


def _facet(name: str, source: str, a: Any, b: Any) -> Facet:
    return Facet(name=name, source=source, from_value=a, to_value=b, status="equal" if a == b else "differs")


def _tool_facet(key: str, a: EnvironmentIdentity, b: EnvironmentIdentity) -> Facet:
    """A version the in-container probe records. Missing from `tools` means "not installed" only where
    the identity's `probed` says the probe looked for it; otherwise it could not be checked."""
    va, vb = a.tools.get(key), b.tools.get(key)
    src = f"identity.tools.{key}"
    known_a = va is not None or (a.probed is not None and key in a.probed)
    known_b = vb is not None or (b.probed is not None and key in b.probed)
    if not (known_a and known_b):
        side = "from" if not known_a else "to"
        note = f"the {side} identity does not record whether {key} is installed (no probe list)"
        return Facet(name=key, source=src, from_value=va, to_value=vb, status="could_not_check", note=note)
    return _facet(key, src, va, vb)


def _devices(ident: EnvironmentIdentity, attr: str) -> list[Any]:
    return [getattr(d, attr) for d in ident.devices]


DEVICE_FIELDS = (
    "name",
    "compute_capability",
    "memory_total_bytes",
    "mig_mode",
    "ecc_mode",
    "power_limit_w",
    "max_sm_clock_mhz",
    "max_mem_clock_mhz",
)


def _host_facets(a: EnvironmentIdentity, b: EnvironmentIdentity) -> dict[str, list[Facet]]:
    """The controller's view (None on both sides is "absent on both": it reads the host directly)."""

    def attr(obj: Any, name: str) -> Any:
        return getattr(obj, name) if obj is not None else None

    return {
        "driver": [_facet("driver_version", "identity.driver_version", a.driver_version, b.driver_version)],
        "gpu": [
            _facet("count", "identity.devices", len(a.devices), len(b.devices)),
            *[_facet(f, f"identity.devices[].{f}", _devices(a, f), _devices(b, f)) for f in DEVICE_FIELDS],
        ],
        "host": [
            _facet(f, f"identity.host.{f}", getattr(a.host, f), getattr(b.host, f))
            for f in ("host_id", "kernel", "cpu_model", "cpu_count")
        ],
        "engine": [
            _facet(f, f"identity.engine.{f}", attr(a.engine, f), attr(b.engine, f))
            for f in ("version", "runtime", "cgroup_version")
        ],
        "passthrough": [_facet("passthrough", "identity.passthrough", a.passthrough, b.passthrough)],
    }


def _image_facets(a: EnvironmentIdentity, b: EnvironmentIdentity) -> list[Facet]:
    ia, ib = (a.image.id if a.image else None), (b.image.id if b.image else None)
    if ia is None or ib is None:
        return [
            Facet(
                name="image_id",
                source="identity.image.id",
                from_value=ia,
                to_value=ib,
                status="could_not_check",
                note="an identity records no image id",
            )
        ]
    return [_facet("image_id", "identity.image.id", ia, ib)]


def _component(name: str, facets: list[Facet]) -> Component:
    st = {f.status for f in facets}
    status: Status = (
        "differs" if "differs" in st else ("could_not_check" if "could_not_check" in st else "equal")
    )
    return Component(name=name, status=status, facets=facets)


def identity_components(a: EnvironmentIdentity, b: EnvironmentIdentity) -> list[Component]:
    """Every component either identity names, in a fixed order: the named ones, then other tools."""
    groups: dict[str, list[Facet]] = {n: [] for n in NAMED}
    groups.update(_host_facets(a, b))
    groups["image"] = _image_facets(a, b)
    groups["cuda"].append(
        _facet(
            "cuda_driver_version",
            "identity.cuda_driver_version",
            a.cuda_driver_version,
            b.cuda_driver_version,
        )
    )
    keys = {*a.tools, *b.tools, *(a.probed or ()), *(b.probed or ()), "torch", "triton", "python"}
    for key in sorted(keys):
        groups.setdefault(TOOL_COMPONENT.get(key, key), []).append(_tool_facet(key, a, b))
    return [_component(name, facets) for name, facets in groups.items()]


# What makes two Targets the same workload: a difference here is not a stack change.
DEFINITION: tuple[tuple[str, str, Callable[[Target], Any]], ...] = (
    ("mode", "one Target is diagnostic", lambda t: t.mode),
    (
        "original",
        "different original snapshots (the code changed)",
        lambda t: t.original and t.original.sha256,
    ),
    ("entry", "different entry file", lambda t: t.entry),
    ("allowed_paths", "different allowed paths", lambda t: t.allowed_paths),
    ("driver", "different driver command", lambda t: t.driver),
    ("cases", "different cases", lambda t: t.cases),
    (
        "objective",
        "different objective (metric, direction, minimum effect, constraints)",
        lambda t: t.objective,
    ),
    ("accuracy", "different accuracy gate", lambda t: t.accuracy),
    ("device", "different device kind", lambda t: t.device),
    ("gpu", "different GPU requirement", lambda t: t.gpu),
)


def stack_diff(a: Target, b: Target) -> StackDiff:
    """The components that differ between two Targets' frozen identities, and what else differs."""
    definition = [DefinitionDiff(field=f, why=why) for f, why, get in DEFINITION if get(a) != get(b)]
    if a.identity is None or b.identity is None:
        definition.append(DefinitionDiff(field="identity", why="a Target has no frozen identity"))
        return StackDiff(definition=definition)
    return StackDiff(components=identity_components(a.identity, b.identity), definition=definition)


def _unexpected(diff: StackDiff, declared: str) -> list[Component]:
    """Components that differ beyond the declared one and what it implies. The image carries every
    in-image component, so a change of any of them changes the image id too."""
    allowed = IMPLIED_FACETS.get(declared, set())
    out = []
    for c in diff.components:
        if c.name == declared or c.status != "differs":
            continue
        if c.name == "image" and declared not in HOST_COMPONENTS:
            continue
        if all(f.status != "differs" or (c.name, f.name) in allowed for f in c.facets):
            continue
        out.append(c)
    return out


def _describe(c: Component) -> str:
    return ", ".join(
        f"{f.name} {f.from_value!r} -> {f.to_value!r}" for f in c.facets if f.status == "differs"
    )


def check_declared(diff: StackDiff, declared: str) -> Component:
    """The declared component, or a coded refusal (exit 2, nothing measured or written) naming why."""
    by = diff.by_name()
    if declared not in by and diff.components:
        raise CkoError(
            f"component: {declared!r} is neither a known component nor recorded in either identity; "
            f"known: {', '.join(by)}",
            field="component",
            code="unknown_component",
        )
    other = _unexpected(diff, declared)
    detail = {"differs": [c.model_dump(mode="json") for c in diff.components if c.status == "differs"]}
    if diff.definition:
        raise CkoError(
            "not a stack change: the two Targets differ in "
            + "; ".join(f"{d.field} ({d.why})" for d in diff.definition),
            field="to",
            code="not_a_stack_change",
            detail=detail | {"definition": [d.model_dump() for d in diff.definition]},
        )
    if other:
        raise CkoError(
            f"more than {declared} differs between the two Targets: "
            + "; ".join(f"{c.name} ({_describe(c)})" for c in other)
            + f". Declare one component per audit, or freeze Targets that differ only in {declared}",
            field="component",
            code="more_than_declared_component",
            detail=detail | {"unexpected": [c.name for c in other]},
        )
    comp = by[declared]
    if comp.status != "differs":
        raise CkoError(
            f"component {declared} does not differ between the two Targets"
            if comp.status == "equal"
            else f"component {declared} could not be checked: "
            + "; ".join(f.note or f.name for f in comp.facets if f.status == "could_not_check"),
            field="component",
            code="declared_component_unchanged" if comp.status == "equal" else "declared_component_unchecked",
            detail=detail,
        )
    if declared in HOST_COMPONENTS:
        raise CkoError(
            f"component {declared} belongs to the host: both originals would run on this host's "
            f"{declared}, so one of them would not run on its own stack; measure each Target where its "
            "identity holds (a fleet node per stack is not built)",
            exit_code=Exit.UNAVAILABLE,
            field="component",
            code="host_component_not_here",
            detail=detail,
        )
    return comp
