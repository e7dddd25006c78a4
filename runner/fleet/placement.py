"""Where an invocation runs on the fleet: the Ray resources it asks for (Ray finds the node).

A GPU invocation takes `num_gpus` plus one custom resource per GPU of its model (`gpu:H200`); CPU
work takes one `cko_slot`. cko adds nothing of a scheduler: these are Ray's options for the actor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import bad_request
from ..invocation import Plan

SLOT = "cko_slot"  # the custom resource CPU invocations take, one each
GPU_MODEL_PREFIX = "gpu:"  # one custom resource per GPU model: gpu:H200


@dataclass
class Placement:
    """Which resources one invocation takes on the fleet; Ray finds the node."""

    num_gpus: int = 0
    gpu_model: str | None = None  # adds the custom resource gpu:<model> per GPU
    resources: dict[str, float] = field(default_factory=dict)  # any other custom resources
    slots: float | None = None  # cko_slot; default: 1 for CPU work, 0 for GPU work
    node_id: str | None = None  # pin to one Ray node (hard affinity)
    devices: list[str] = field(default_factory=list)  # with node_id: these GPU UUIDs of that node

    def resource_request(self) -> dict[str, float]:
        res = {k: float(v) for k, v in self.resources.items()}
        if self.gpu_model:
            if self.num_gpus < 1:
                raise bad_request("gpu_model: needs at least one GPU (num_gpus >= 1)", field="gpu_model")
            key = GPU_MODEL_PREFIX + self.gpu_model
            res[key] = res.get(key, 0.0) + float(self.num_gpus)
        slots = self.slots if self.slots is not None else (0.0 if self.num_gpus else 1.0)
        if slots:
            res[SLOT] = res.get(SLOT, 0.0) + float(slots)
        for k, v in res.items():
            if not k or v < 0 or v != v:
                raise bad_request(f"resources: {k!r}={v} is not a valid resource request", field="resources")
        return {k: v for k, v in res.items() if v > 0}

    def ray_options(self) -> dict[str, Any]:
        if self.num_gpus < 0:
            raise bad_request("num_gpus: must be >= 0", field="gpus")
        if self.devices and (not self.node_id or len(self.devices) != self.num_gpus):
            raise bad_request(
                "devices: name exactly num_gpus GPUs, on a pinned node (node_id)", field="devices"
            )
        opts: dict[str, Any] = {
            "num_cpus": 0,
            "num_gpus": self.num_gpus,
            "resources": self.resource_request(),
            "max_restarts": 0,  # an invocation is never re-run behind the caller's back
            "max_task_retries": 0,
        }
        if self.node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return opts

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"num_gpus": self.num_gpus, "resources": self.resource_request()}
        if self.node_id:
            doc["node_id"] = self.node_id
        if self.devices:
            doc["devices"] = list(self.devices)
        return doc


def placement_for(
    plan: Plan,
    gpu_model: str | None = None,
    resources: Mapping[str, float] | None = None,
    node_id: str | None = None,
    slots: float | None = None,
) -> Placement:
    """The placement a Plan asks for: as many GPUs as it names; on the node they become Ray's GPUs."""
    if plan.gpus == ["all"]:
        raise bad_request(
            "gpus: 'all' has no meaning on a fleet; give a count (or that many indexes)", field="gpus"
        )
    return Placement(
        num_gpus=len(plan.gpus),
        gpu_model=gpu_model,
        resources=dict(resources or {}),
        node_id=node_id,
        slots=slots,
    )
