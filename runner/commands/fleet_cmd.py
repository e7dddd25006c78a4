"""`cko fleet status|run|combine`: invocations on a Ray cluster (runner/fleet/, docs/fleet.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, ValidationError
from rich.table import Table

from ..cliutil import Outcome, common, handled, load_json_file, say
from ..errors import Exit, bad_request, pydantic_error
from ..fleet import Placement, cli_session
from ..invocation import Plan
from ..models import Closed
from ..store import Store
from .exec_cmd import parse_mount

FLEET_HELP = (
    "Ray cluster address: host:port, ray://host:10001 or auto (default $CKO_FLEET, $RAY_ADDRESS, auto)."
)


def fleet_option(f: Any) -> Any:
    return click.option("--fleet", "fleet", metavar="ADDRESS", help=FLEET_HELP)(f)


class FleetPlanSpec(Closed):
    """One invocation of a `cko fleet run` plans file (the same fields as `cko exec`)."""

    command: list[str] = Field(min_length=1)
    image: Literal["cpu", "cuda"] = "cpu"
    gpus: int = Field(default=0, ge=0, description="how many GPUs; Ray picks them on the node")
    gpu_model: str | None = Field(default=None, description="adds the custom resource gpu:<model> per GPU")
    resources: dict[str, float] = Field(default_factory=dict, description="other custom Ray resources")
    slots: float | None = Field(
        default=None, ge=0, description="cko_slot (default 1 for CPU work, 0 with GPUs)"
    )
    node: str | None = Field(default=None, description="a Ray node id to pin it to")
    timeout_s: float = 600.0
    memory: str = "4g"
    pids: int = 1024
    cpus: float | None = None
    env: dict[str, str] = Field(default_factory=dict)
    label: str = ""
    workdir: str = "/tmp"
    mounts: list[str] = Field(
        default_factory=list, description="SRC:DST[:ro|rw]; SRC relative to the plans file"
    )


class PlansFile(Closed):
    plans: list[FleetPlanSpec] = Field(min_length=1)


def _plan(spec: FleetPlanSpec, base: Path, policy: Path | None) -> tuple[Plan, Placement]:
    mounts = []
    for text in spec.mounts:
        m = parse_mount(text)
        if not Path(m.source).is_absolute():
            m.source = str(base / m.source)
        mounts.append(m)
    plan = Plan(
        op="exec",
        command=spec.command,
        image=spec.image,
        gpus=[str(i) for i in range(spec.gpus)],
        mounts=mounts,
        timeout_s=spec.timeout_s,
        memory=spec.memory,
        pids=spec.pids,
        cpus=spec.cpus,
        env=spec.env,
        label=spec.label or "exec " + " ".join(spec.command)[:80],
        workdir=spec.workdir,
        policy_path=str(policy) if policy else None,
    )
    placement = Placement(
        num_gpus=spec.gpus,
        gpu_model=spec.gpu_model,
        resources=spec.resources,
        slots=spec.slots,
        node_id=spec.node,
    )
    return plan, placement


@click.group("fleet")
def fleet_group() -> None:
    """Run invocations on the nodes of a Ray cluster (optional extra: pip install 'cko-perf[ray]')."""


@fleet_group.command("status")
@fleet_option
@click.option(
    "--probe/--no-probe", default=True, show_default=True, help="Run a readiness probe on every node."
)
@click.option("--probe-timeout", type=float, default=60.0, show_default=True, help="Seconds for all probes.")
@common
@handled
def status_cmd(store: Path, as_json: bool, fleet: str | None, probe: bool, probe_timeout: float) -> Outcome:
    """The fleet's nodes, their resources, and whether each can run cko (engine, pinned images, GPUs)."""
    with cli_session(fleet) as fl:
        doc = fl.status(probe=probe, timeout_s=probe_timeout)
    t = Table(title=f"fleet {doc['address']} (Ray {doc['ray_version']})")
    for col in ("node", "host", "alive", "resources (available/total)", "cko"):
        t.add_column(col)
    for n in doc["nodes"]:
        res = ", ".join(f"{k} {n['available'].get(k, 0):g}/{v:g}" for k, v in n["resources"].items())
        ck = n.get("cko")
        ready = (
            "-" if ck is None else ("ready" if ck.get("ready") else "; ".join(ck.get("blockers", []))[:80])
        )
        t.add_row(n["node_id"][:12], str(n["hostname"]), str(n["alive"]), res, ready)
    code = Exit.DONE
    if probe and not any((n.get("cko") or {}).get("ready") for n in doc["nodes"]):
        code = Exit.UNAVAILABLE
    return Outcome(doc=doc, human=t, exit_code=code)


@fleet_group.command("run")
@fleet_option
@click.option(
    "--plans",
    "plans_path",
    required=True,
    type=click.Path(path_type=Path),
    help='JSON: {"plans": [{"command": [...], "resources": {...}, ...}, ...]}.',
)
@click.option(
    "--ship",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="auto: read-only mounts travel as bytes; none: every mount path must exist on the node.",
)
@click.option(
    "--queue-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds an invocation may wait for a node with its resources.",
)
@click.option(
    "--policy", "policy", type=click.Path(path_type=Path), help="Ops policy YAML (default $CKO_POLICY)."
)
@common
@handled
def run_cmd(
    store: Path,
    as_json: bool,
    fleet: str | None,
    plans_path: Path,
    ship: str,
    queue_timeout: float,
    policy: Path | None,
) -> Outcome:
    """Run several invocations at once on the fleet; each lands in --store (verified) as it ends.

    Exit code: 0 if every one succeeded, else the exit code of the first (in file order) that did not.
    """
    raw = load_json_file(plans_path, "plans")
    try:
        spec = PlansFile.model_validate(raw if isinstance(raw, dict) else {"plans": raw})
    except ValidationError as exc:
        raise pydantic_error(exc, f"plans {plans_path}") from None
    base = Path(plans_path).absolute().parent
    items = [_plan(p, base, policy) for p in spec.plans]
    st = Store(store)
    with cli_session(fleet) as fl:
        runs = fl.run_many(
            st,
            items,
            progress=say,
            ship=ship,  # type: ignore[arg-type]
            queue_timeout_s=queue_timeout,
        )
    docs = [r.as_dict() for r in runs]
    states: dict[str, int] = {}
    for d in docs:
        key = d.get("state") or "error"
        states[key] = states.get(key, 0) + 1
    code = next((r.exit_code for r in runs if r.exit_code != 0), 0)
    t = Table(title=f"{len(runs)} invocation(s) on {fl.address}")
    for col in ("label", "id", "state", "node", "exit"):
        t.add_column(col)
    for d in docs:
        t.add_row(
            d["label"],
            d["id"] or "-",
            d.get("state") or d["error"]["error"],
            ((d.get("node") or {}).get("node_id") or "-")[:12],
            str(d["exit_code"]),
        )
    return Outcome(doc={"fleet": fl.address, "invocations": docs, "states": states}, human=t, exit_code=code)


@fleet_group.command("combine")
@click.option(
    "--results",
    "results_path",
    required=True,
    type=click.Path(path_type=Path),
    help="JSON array of per-device analyses: device, verdict, effect_pct, ci_low_pct, ci_high_pct, pool.",
)
@common
@handled
def combine_cmd(store: Path, as_json: bool, results_path: Path) -> Outcome:
    """One verdict over the devices of one identity pool, each analysed on its own (never pooled)."""
    from ..workflow.per_device import combine_per_device  # numpy and scipy: only this command needs them

    raw = load_json_file(results_path, "results")
    if not isinstance(raw, list):
        raise bad_request("results: must be a JSON array of per-device analyses", field="results")
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise bad_request(
                f"results[{i}]: must be an object (device, verdict, effect_pct, ...), not "
                f"{type(item).__name__}",
                field=f"results[{i}]",
            )
    c = combine_per_device(raw)
    t = Table(title=f"combined verdict: {c.verdict}")
    for col in ("device", "verdict", "effect %", "CI %"):
        t.add_column(col)
    for d in c.devices:
        ci = (
            f"[{d.ci_low_pct:.2f}, {d.ci_high_pct:.2f}]"
            if d.ci_low_pct is not None and d.ci_high_pct is not None
            else "-"
        )
        t.add_row(d.device, d.verdict, "-" if d.effect_pct is None else f"{d.effect_pct:.2f}", ci)
    return Outcome(doc=c.model_dump(mode="json"), human=t)


commands = [fleet_group]
