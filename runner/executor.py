"""Where an invocation runs: the one seam between the workflow and a backend (DESIGN.md, Beyond one machine).

The workflow (readiness, baseline, experiment, audit) builds Plans and reads Outcomes; an Executor
runs one Plan to a terminal state and records it in the caller's store. `LOCAL` runs it on this
host (`invocation.execute`); `runner.fleet.FleetExecutor` places it on a node of a Ray cluster,
where the same `execute` runs, and imports the verified records. Both leave the same records and
return the same Outcome, so the measurement logic exists once. What differs is where the
container runs, hence what readiness must find there first (`preflight`).

This module imports nothing of the fleet: the fleet implements this Protocol and imports its types.
A command picks one of the two with `runner.fleet.open_executor` (its --fleet option).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from . import gpu as gpumod
from . import images as img
from .errors import CkoError
from .invocation import Outcome, Plan, execute
from .store import Store

Blocker = dict[str, str]  # a readiness blocker: what, reason, next_step


class Executor(Protocol):
    def __call__(
        self,
        store: Store,
        plan: Plan,
        progress: Callable[[str], None] | None = None,
        keep_outputs: bool = False,
    ) -> Outcome: ...

    def preflight(self, image: str, gpus: int) -> list[Blocker]:
        """What stops an invocation of `image` with `gpus` GPUs from running here (empty: nothing)."""
        ...


class LocalExecutor:
    """This host: the invocation runs in the local engine, on this host's GPUs."""

    def __call__(
        self,
        store: Store,
        plan: Plan,
        progress: Callable[[str], None] | None = None,
        keep_outputs: bool = False,
    ) -> Outcome:
        return execute(store, plan, progress=progress, keep_outputs=keep_outputs)

    def preflight(self, image: str, gpus: int) -> list[Blocker]:
        blockers: list[Blocker] = []
        if gpus:
            hg = gpumod.host_gpus()
            if not hg.available or len(hg.devices) < gpus:
                blockers.append(
                    {
                        "what": "gpu",
                        "reason": hg.reason or f"{len(hg.devices)} GPU(s), {gpus} required",
                        "next_step": "run on a host with the GPU (cko doctor shows what this one has), "
                        "or on a fleet that has it (--fleet)",
                    }
                )
        try:
            img.resolve(image, img.docker_client())
        except CkoError as err:
            if err.code == "engine_unavailable":
                raise
            blockers.append(
                {
                    "what": "image",
                    "reason": err.message,
                    "next_step": f"cko images build {image}",
                }
            )
        return blockers


LOCAL = LocalExecutor()
