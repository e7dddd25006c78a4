"""Run one in-container operation (`python -I -m operations OP ...`) as an Invocation.

Inputs are mounted read-only at /cko/in/<name>; the operation writes /cko/out/result.json.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hostpath
from .errors import failed
from .invocation import OOM_REASON, Plan, execute
from .policy import load_policy
from .sandbox import Mount
from .store import Store, new_id


@dataclass
class OperationResult:
    invocation_id: str
    exit_code: int  # the container's exit code (None → -1)
    state: str
    doc: dict[str, Any] | None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    stderr_tail: str = ""


def run_operation(
    *,
    store: Store,
    op: str,
    args: list[str],
    inputs: dict[str, Path],
    image: str = "cpu",
    gpus: list[str] | None = None,
    timeout: float = 600.0,
    label: str = "",
    counters: bool = False,
    extra_mounts: list[Mount] | None = None,
    memory: str | None = None,
    parent: dict[str, Any] | None = None,
    policy_path: str | None = None,
) -> OperationResult:
    if image == "cpu":  # a GPU host built without the cpu image parses in the cuda image instead
        image = os.environ.get("CKO_PARSE_IMAGE", "cpu")
    # cko's own staging, in the store's scratch: the only kind of path a container mounts.
    staging = store.scratch(new_id("stg"))
    staging.mkdir(parents=True, mode=0o700)
    try:
        mounts = list(extra_mounts or [])
        policy, _ = load_policy(policy_path)
        for name, src in inputs.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"bad input name {name}")
            # A private copy read by descriptor (resolved once, no link followed, within mount_roots, a
            # regular file): the container sees exactly the bytes we hash, even if the source changes.
            dst = staging / name
            dst.write_bytes(hostpath.read_file(src, name, policy))
            dst.chmod(0o644)
            mounts.append(Mount(str(dst), f"/cko/in/{name}", read_only=True))
        staging.chmod(0o755)
        plan = Plan(
            op=op,
            command=["/opt/cko/bin/python", "-I", "-m", "operations", op, *args, "--out", "/cko/out"],
            image=image,
            gpus=list(gpus or []),
            mounts=mounts,
            timeout_s=timeout,
            label=label or op,
            counters=counters,
            memory=memory,
            parent=parent,
            policy_path=policy_path,
        )
        outcome = execute(store, plan, keep_outputs=True)
        try:
            doc = outcome.read_json("result.json")
            res = outcome.result
            if not isinstance(doc, dict) and res.reason == OOM_REASON:
                # Parsing holds the report in memory (a torch trace whole, plus its kept events), so a
                # report large enough meets the limit: every caller says so, naming the option.
                raise failed(
                    f"{op}: the parse was stopped at its memory limit of {memory or 'the policy default'} (invocation {outcome.id}); "
                    "a larger --memory, within the policy's max_memory, lets it finish",
                    code="out_of_memory",
                    field="memory",
                )
            return OperationResult(
                invocation_id=outcome.id,
                exit_code=res.container_exit_code if res.container_exit_code is not None else -1,
                state=res.state,
                doc=doc if isinstance(doc, dict) else None,
                outputs=[o.model_dump(mode="json") for o in res.outputs],
                reason=res.reason,
                stderr_tail=res.stderr_tail,
            )
        finally:
            outcome.close()
    finally:
        hostpath.remove_tree(staging)
