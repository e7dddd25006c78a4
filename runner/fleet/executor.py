"""The fleet behind the workflow's one seam: `FleetExecutor` is an `executor.Executor` on a Ray cluster.

The import runs one way: the fleet imports `runner.executor`'s types; `runner.executor` knows
nothing of the fleet. Which of the two a command runs on is `controller.open_executor`'s choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import images as img
from ..executor import Blocker
from ..invocation import Outcome, Plan
from ..store import Store
from .placement import Placement, placement_for
from .wire import Ship

if TYPE_CHECKING:  # a FleetExecutor is handed its Fleet; only the type is needed here
    from .controller import Fleet


class FleetExecutor:
    """`invocation.execute` on the fleet, for the workflow (runner/executor.py's Executor).

    sticky: after the first invocation, every later one goes to the same node (and, when it used
    GPUs, the same GPU UUIDs), so that all the measurements of one experiment (its sequential
    looks) are pairs measured on one device. Ray still accounts a GPU of that node for each; the
    node's per-GPU flock serialises it with anything else on that device.
    """

    def __init__(
        self,
        fleet: Fleet,
        placement: Placement | None = None,
        ship: Ship = "auto",
        sticky: bool = True,
        gpu_model: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.placement = placement
        self.ship: Ship = ship
        self.sticky = sticky
        self.gpu_model = gpu_model
        self.pinned: dict[str, Any] = {}  # node_id, devices: where the first invocation ran

    def _where(self, plan: Plan) -> Placement:
        where = (
            dataclasses.replace(self.placement)
            if self.placement
            else placement_for(plan, gpu_model=self.gpu_model)
        )
        if self.pinned:
            where.node_id = self.pinned["node_id"]
            if plan.gpus and self.pinned["devices"]:
                where.devices = list(self.pinned["devices"])
                where.num_gpus = len(where.devices)
        return where

    def __call__(
        self,
        store: Store,
        plan: Plan,
        progress: Callable[[str], None] | None = None,
        keep_outputs: bool = False,
    ) -> Outcome:
        fr = self.fleet.run_many(
            store, [(plan, self._where(plan))], progress=progress, keep_outputs=keep_outputs, ship=self.ship
        )[0]
        if self.sticky and not self.pinned and fr.node and fr.outcome is not None:
            ident = fr.outcome.result.identity
            self.pinned = {
                "node_id": fr.node.node_id,
                "devices": [d.uuid for d in ident.devices] if ident is not None else [],
            }
        if fr.error is not None:
            raise fr.error
        assert fr.outcome is not None
        return fr.outcome

    def preflight(self, image: str, gpus: int) -> list[Blocker]:
        """Some live node has the resources, a ready engine and the controller's pinned image."""
        entry = img.load_lock().images.get(image)
        if entry is None:
            return [
                {
                    "what": "image",
                    "reason": f"this controller's images.lock pins no {image} image: nodes cannot be checked",
                    "next_step": f"cko images build {image}" + (" --offline" if image == "cpu" else ""),
                }
            ]
        need = Placement(num_gpus=gpus, gpu_model=self.gpu_model).resource_request()
        if gpus:
            need["GPU"] = float(gpus)
        doc = self.fleet.status(probe=True)
        reasons: list[str] = []
        for n in doc["nodes"]:
            if not n["alive"]:
                continue
            reason = _node_lacks(n, need, image, entry.image_id)
            if reason is None:
                return []
            reasons.append(reason)
        return [
            {
                "what": "fleet",
                "reason": f"no node of {self.fleet.address} can run it: "
                + ("; ".join(reasons) or "no node is alive"),
                "next_step": "start a node with those resources and the same pinned image "
                "(cko fleet status shows each node; docs/fleet.md)",
            }
        ]


def _node_lacks(n: dict[str, Any], need: dict[str, float], image: str, pinned: str) -> str | None:
    """Why one live node of `Fleet.status` cannot run the invocation (None: it can)."""
    name = f"{n['node_id'][:12]} ({n.get('hostname')})"
    res = n["resources"]
    lacking = [f"{k} {res.get(k, 0):g} of {v:g}" for k, v in sorted(need.items()) if res.get(k, 0) < v]
    ck = n.get("cko") or {}
    im = (ck.get("images") or {}).get(image) or {}
    if lacking:
        return f"{name}: has {', '.join(lacking)}"
    if not ck.get("ready"):
        return f"{name}: {'; '.join(ck.get('blockers') or ['not ready'])}"
    if not im.get("ok"):
        return f"{name}: image {image}: {im.get('reason')}"
    if im.get("image_id") != pinned:
        return f"{name}: pins {image} as {str(im.get('image_id'))[:19]}, the controller as {pinned[:19]}"
    return None
