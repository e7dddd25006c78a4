"""The fleet backend: invocations placed on the nodes of a Ray cluster (DESIGN.md, Beyond one machine).

One job per module, imported in this order (each only from those above it):

- `placement.py`: the Ray resources one invocation asks for (`Placement`, `placement_for`);
- `wire.py`: the messages between controller and node, one pydantic model each, and how a Plan
  and its shipped inputs travel (`plan_to_wire`, `plan_from_wire`);
- `node.py`: what runs on a Ray node (the `NodeRunner` actor, its watchdog, cleanup, the probe);
- `executor.py`: `FleetExecutor`, the fleet behind `runner.executor.Executor`;
- `landing.py`: what the controller writes to its own store, and when;
- `controller.py`: `Fleet` (connect, status, run_many), `cli_session`, `open_executor`.

Per-device verdicts (`combine_per_device`, `analyse_device`) are verdict rules, not fleet code:
they live in `runner.workflow.per_device` and are re-exported here for the fleet's callers.
Ray itself is imported only when a fleet is used, never at import time.
"""

from typing import TYPE_CHECKING, Any

from .controller import Fleet, cli_session, open_executor
from .executor import FleetExecutor
from .landing import FleetRun
from .placement import Placement, placement_for
from .wire import plan_from_wire, plan_to_wire

if TYPE_CHECKING:
    from ..workflow.per_device import CombinedVerdict, DeviceAnalysis, analyse_device, combine_per_device

# Re-exported on first use (PEP 562), not at import: every command that can take --fleet imports
# this package (open_executor), and per_device brings in operations.stats with numpy and scipy
# (about two seconds), which `cko exec` without --fleet never needs.
_PER_DEVICE = ("CombinedVerdict", "DeviceAnalysis", "analyse_device", "combine_per_device")


def __getattr__(name: str) -> Any:
    if name in _PER_DEVICE:
        from ..workflow import per_device

        return getattr(per_device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CombinedVerdict",
    "DeviceAnalysis",
    "Fleet",
    "FleetExecutor",
    "FleetRun",
    "Placement",
    "analyse_device",
    "cli_session",
    "combine_per_device",
    "open_executor",
    "placement_for",
    "plan_from_wire",
    "plan_to_wire",
]
