"""Freeze, thaw and account a container's whole process tree through its cgroup (host side).

The cgroup holds every process of the container, detached children and double forks included,
and keeps the CPU time of those that already exited, so "did this subject run while the other was
timed" has an exact answer that no process inside can change. cgroup v1 (freezer + cpuacct) and
v2 (cgroup.freeze + cpu.stat) are both handled; a host with neither cannot measure under the
trust boundary and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
FREEZE_TIMEOUT_S = 5.0


class FreezerError(RuntimeError):
    pass


def _cgroup_lines(pid: int) -> list[tuple[str, str]]:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError as exc:
        raise FreezerError(f"cannot read the cgroups of pid {pid}: {exc.strerror}") from None
    out = []
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        out.append((controllers, path))
    return out


@dataclass
class Cgroup:
    kind: str  # "cgroup-v1" | "cgroup-v2"
    freeze_file: Path
    state_file: Path
    usage_file: Path

    @classmethod
    def of_pid(cls, pid: int, root: Path = CGROUP_ROOT) -> Cgroup:
        lines = _cgroup_lines(pid)
        v1 = {c: p for cs, p in lines for c in cs.split(",") if cs}
        if "freezer" in v1 and "cpuacct" in v1:
            fz = cls._v1_dir(root, "freezer", v1["freezer"])
            acct = cls._v1_dir(root, "cpuacct", v1["cpuacct"])
            return cls("cgroup-v1", fz / "freezer.state", fz / "freezer.state", acct / "cpuacct.usage")
        unified = [p for cs, p in lines if cs == ""]
        if unified and (root / unified[0].lstrip("/") / "cgroup.freeze").exists():
            d = root / unified[0].lstrip("/")
            return cls("cgroup-v2", d / "cgroup.freeze", d / "cgroup.events", d / "cpu.stat")
        raise FreezerError(f"pid {pid}: no cgroup freezer found (v1 freezer+cpuacct or v2 cgroup.freeze)")

    @staticmethod
    def _v1_dir(root: Path, controller: str, path: str) -> Path:
        for mount in (controller, "cpu,cpuacct" if controller == "cpuacct" else controller):
            d = root / mount / path.lstrip("/")
            if d.is_dir():
                return d
        raise FreezerError(f"cgroup v1 {controller} directory for {path} not found under {root}")

    def usage_ns(self) -> int:
        text = self.usage_file.read_text()
        if self.kind == "cgroup-v1":
            return int(text.strip())
        for line in text.splitlines():
            if line.startswith("usage_usec"):
                return int(line.split()[1]) * 1000
        raise FreezerError(f"{self.usage_file}: no usage_usec")

    def frozen(self) -> bool:
        text = self.state_file.read_text()
        if self.kind == "cgroup-v1":
            return text.strip() == "FROZEN"
        return any(line.strip() == "frozen 1" for line in text.splitlines())

    def set_frozen(self, frozen: bool) -> None:
        """Write the freezer and wait until the kernel reports the whole tree in that state."""
        if self.kind == "cgroup-v1":
            self.freeze_file.write_text("FROZEN" if frozen else "THAWED")
        else:
            self.freeze_file.write_text("1" if frozen else "0")
        deadline = time.monotonic() + FREEZE_TIMEOUT_S
        delay = 20e-6
        while self.frozen() != frozen:
            if time.monotonic() > deadline:
                raise FreezerError(
                    f"{self.freeze_file}: not {'frozen' if frozen else 'thawed'} after {FREEZE_TIMEOUT_S:g}s"
                )
            if self.kind == "cgroup-v1" and frozen:
                self.freeze_file.write_text("FROZEN")  # v1 may stay FREEZING until asked again
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
