"""GPU architecture names: `sm_80`, `sm_89`, `sm_90`, `sm_90a`, `sm_100`, `sm_100f`, `sm_120`.

The digits are the compute capability without its dot (last digit = minor): `sm_90` is 9.0,
`sm_100` is 10.0, `sm_103` is 10.3, `sm_89` is 8.9.

In a card condition the suffix says which devices a compilation target runs on (CUDA C++
Programming Guide, "Compute Capability and Streaming Multiprocessor Versions"; PTX ISA, "Target
ISA notes"):
- `sm_90` (no suffix): a device of exactly compute capability 9.0;
- `sm_90a` (architecture-specific features): also exactly 9.0 (code built for it runs on no
  other device);
- `sm_100f` (family-specific features, CUDA 12.9+): devices of the same major version and an
  equal or higher minor version (10.0 and 10.3 for `sm_100f`).

An identity names a device: `sm_90` or `sm_90a` (the same device, compiled for its
architecture-specific target), or a compute capability such as `9.0`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH_RE = re.compile(r"^sm_(?P<num>[0-9]{2,3})(?P<suffix>[af]?)$")
_CC_RE = re.compile(r"^(?P<major>[0-9]{1,2})\.(?P<minor>[0-9])$")


class ArchError(ValueError):
    """Not an architecture name."""


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""  # "", "a" (architecture-specific) or "f" (family-specific)

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def device(self) -> str:
        """The device name without a suffix: sm_90a -> sm_90."""
        return f"sm_{self.major}{self.minor}"

    def covers(self, device: Arch) -> bool:
        """Whether code for this target (a card condition) runs on `device`."""
        if self.suffix == "f":
            return device.major == self.major and device.minor >= self.minor
        return device.cc == self.cc

    def __str__(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"


def parse_arch(text: str) -> Arch:
    """Parse `sm_90`, `sm_90a`, `sm_100f`; raise ArchError otherwise."""
    if not isinstance(text, str):
        raise ArchError(f"not an architecture: {text!r}")
    m = _ARCH_RE.match(text.strip().lower())
    if not m:
        raise ArchError(f"not an architecture: {text!r} (expected e.g. sm_80, sm_90a, sm_100f)")
    num = m.group("num")
    major, minor = int(num[:-1]), int(num[-1])
    if major < 1:
        raise ArchError(f"not an architecture: {text!r}")
    return Arch(major=major, minor=minor, suffix=m.group("suffix"))


def parse_device_arch(text: str) -> Arch:
    """An identity's device: `sm_90`, `sm_90a` or a compute capability `9.0`.

    A family target (`sm_100f`) names a set of devices, not one, so it is refused here.
    """
    if not isinstance(text, str):
        raise ArchError(f"not an architecture: {text!r}")
    s = text.strip().lower()
    m = _CC_RE.match(s)
    if m:
        return Arch(major=int(m.group("major")), minor=int(m.group("minor")))
    arch = parse_arch(s)
    if arch.suffix == "f":
        raise ArchError(f"{text!r} is a family target, not a device (give the device, e.g. sm_100)")
    return arch


def from_compute_capability(cc: str) -> Arch:
    """`9.0` -> sm_90; raise ArchError for anything but MAJOR.MINOR."""
    m = _CC_RE.match(cc.strip()) if isinstance(cc, str) else None
    if not m:
        raise ArchError(f"not a compute capability: {cc!r} (expected e.g. '9.0')")
    return Arch(major=int(m.group("major")), minor=int(m.group("minor")))
