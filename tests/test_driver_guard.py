"""The helper's snapshot of the harness's modules and classes (issue 10), in-process and engine-free.

A candidate that swaps a method of a class the accuracy check relies on (`torch.Tensor.cpu`, say)
leaves every module attribute as it was; the class snapshot must still see it. A stand-in module
and class play torch here, so the test needs neither torch nor a GPU.
"""

from __future__ import annotations

import sys
import types

import pytest

from cko_perf.operations import driver


class _Base:
    def cpu(self) -> str:
        return "real"


class _Tensor(_Base):
    def double(self) -> str:
        return "real"


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> type:
    mod = types.ModuleType("cko_fake_torch")
    cls = type("Tensor", (_Tensor,), {})
    mod.Tensor = cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cko_fake_torch", mod)
    monkeypatch.setattr(driver, "GUARDED_CLASSES", (("cko_fake_torch", "Tensor"),))
    return cls


def test_untouched_classes_show_no_change(fake_torch: type) -> None:
    before = driver.module_snapshot()
    assert driver.snapshot_changes(before, driver.module_snapshot()) == []


def test_a_method_swapped_on_a_base_class_is_named(fake_torch: type, monkeypatch: pytest.MonkeyPatch) -> None:
    before = driver.module_snapshot()
    monkeypatch.setattr(_Tensor, "double", lambda self: "fake")
    assert driver.snapshot_changes(before, driver.module_snapshot()) == [f"{__name__}._Tensor.double"]


def test_a_method_added_that_shadows_a_base_method_is_named(fake_torch: type) -> None:
    before = driver.module_snapshot()
    fake_torch.cpu = lambda self: "zeros"  # the class had no `cpu` of its own: _Base's was used
    changes = driver.snapshot_changes(before, driver.module_snapshot())
    assert changes == [f"{fake_torch.__module__}.Tensor.cpu"], changes
    assert fake_torch().cpu() == "zeros"


def test_a_new_name_that_shadows_nothing_is_not_a_violation(fake_torch: type) -> None:
    before = driver.module_snapshot()
    fake_torch.brand_new_helper = lambda self: 1
    assert driver.snapshot_changes(before, driver.module_snapshot()) == []


def test_a_module_function_replaced_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    before = driver.module_snapshot()
    monkeypatch.setattr(sys.modules["math"], "sqrt", lambda x: 0.0)
    assert "math.sqrt" in driver.snapshot_changes(before, driver.module_snapshot())


class _FakeEvent:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.at: float | None = None

    def synchronize(self) -> None:
        self.log.append("event sync")


def test_device_clock_window_synchronises_the_whole_device_before_the_end_event() -> None:
    """The event window of the GPU backends, with a stand-in library: work left in flight by the run
    (another stream, an async launch) lands inside the window because the device sync precedes `end`."""
    log: list[str] = []
    clock = driver._DeviceEvents()
    clock.synchronize = lambda: log.append("device sync")
    clock.new_event = lambda: _FakeEvent(log)

    def record(ev: _FakeEvent) -> None:
        ev.at = float(len(log))
        log.append("record")

    clock.record = record
    clock.elapsed_ms = lambda a, b: b.at - a.at  # "ms" = log entries between the two records
    out, t_ns, wall_ns, stream_ns = clock.time(lambda: log.append("run") or "out")
    assert log == ["device sync", "record", "run", "record", "device sync", "record", "event sync"]
    # the window spans the device sync; the stream's own time ends where the run returned, before it
    assert out == "out" and t_ns == 4_000_000 and stream_ns == 2_000_000 and wall_ns > 0
