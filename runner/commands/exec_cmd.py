"""`cko exec`: one command in the sandbox, recorded as an Invocation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..cliutil import Outcome, common, fleet_options, handled, say
from ..errors import bad_request
from ..fleet import open_executor
from ..invocation import Plan
from ..sandbox import Mount
from ..store import Store


def parse_mount(text: str) -> Mount:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise bad_request(f"--mount {text!r}: expected SRC:DST or SRC:DST:ro|rw", field="mount")
    mode = parts[2] if len(parts) == 3 else "ro"
    if mode not in ("ro", "rw"):
        raise bad_request(f"--mount {text!r}: mode must be ro or rw", field="mount")
    return Mount(source=parts[0], target=parts[1], read_only=mode == "ro")


def parse_gpus(text: str | None) -> list[str]:
    if not text or text == "none":
        return []
    if text == "all":
        return ["all"]
    return [g.strip() for g in text.split(",") if g.strip()]


def invocation_table(res: dict[str, Any]) -> Table:
    t = Table(show_header=False, box=None)
    for k in ("id", "state", "exit_code", "container_exit_code", "reason", "duration_s"):
        if res.get(k) is not None:
            t.add_row(k, str(res[k]))
    t.add_row("outputs", ", ".join(o.get("name") or o["sha256"][:12] for o in res.get("outputs", [])) or "-")
    ident = res.get("identity") or {}
    if ident.get("image"):
        t.add_row("image", f"{ident['image']['name']} {ident['image']['id'][:19]}")
    if ident.get("devices"):
        t.add_row("gpus", ", ".join(f"{d['name']} {d['uuid']}" for d in ident["devices"]))
    return t


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.option(
    "--image",
    default="cpu",
    show_default=True,
    help="An image name from the lock (cpu, cuda, torch-cpu, a project recipe).",
)
@click.option(
    "--gpus", help="all, none, or a comma-separated list of GPU UUIDs (or indexes); with --fleet, a count."
)
@click.option(
    "--gpu-mode",
    type=click.Choice(["nvidia", "cdi", "devices", "none"]),
    help="GPU passthrough mode (default: the best usable, see `cko doctor`).",
)
@click.option(
    "--timeout", "timeout", type=float, default=600.0, show_default=True, help="Seconds before stop/kill."
)
@click.option("--mount", "mounts", multiple=True, help="SRC:DST[:ro|rw] (default ro). Repeatable.")
@click.option(
    "--memory", default=None, help="Memory limit (e.g. 512m, 4g); default: the policy's default_memory."
)
@click.option("--pids", default=None, type=int, help="Process limit; default: the policy's default_pids.")
@click.option(
    "--cpus", type=float, help="CPU limit (cores); default: the policy's default_cpus (always set)."
)
@click.option("--workdir", default="/tmp", show_default=True, help="Working directory inside the container.")
@click.option(
    "--policy", "policy", type=click.Path(path_type=Path), help="Ops policy YAML (default $CKO_POLICY)."
)
@fleet_options
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@common
@handled
def exec_cmd(
    store: Path,
    as_json: bool,
    image: str,
    gpus: str | None,
    gpu_mode: str | None,
    timeout: float,
    mounts: tuple[str, ...],
    memory: str | None,
    pids: int | None,
    cpus: float | None,
    workdir: str,
    policy: Path | None,
    fleet: str | None,
    gpu_model: str | None,
    cmd: tuple[str, ...],
) -> Outcome:
    """Run CMD in the sandbox as a recorded Invocation (builds, compiler runs, probes).

    Output files written under /cko/out inside the container are hashed into the store.
    Exit code: 0 if CMD succeeded, 1 if it failed, 4 if it timed out, 3 if refused by policy.
    """
    plan = Plan(
        op="exec",
        command=list(cmd),
        image=image,
        gpus=parse_gpus(gpus),
        gpu_mode=gpu_mode,
        mounts=[parse_mount(m) for m in mounts],
        timeout_s=timeout,
        memory=memory,
        pids=pids,
        cpus=cpus,
        label="exec " + " ".join(cmd)[:80],
        workdir=workdir,
        policy_path=str(policy) if policy else None,
    )
    if fleet and gpus and gpus.isdigit():
        plan.gpus = [str(i) for i in range(int(gpus))]  # a count: Ray picks the GPUs on the node
    st = Store(store)
    with open_executor(fleet, gpu_model) as run:
        outcome = run(st, plan, progress=say)
    doc = outcome.result.model_dump(mode="json")
    doc["invocation_id"] = doc["id"]
    human = invocation_table(doc)
    extra = []
    if not as_json and outcome.result.stdout_tail:
        extra.append(outcome.result.stdout_tail.rstrip())
    return Outcome(doc=doc, human=human, exit_code=outcome.exit_code, extra_human=extra)


commands = [exec_cmd]
