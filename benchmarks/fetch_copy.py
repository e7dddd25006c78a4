"""What a check's fetch costs the worker: a device output written as `.npy` into fresh tmpfs files.

    python3 benchmarks/fetch_copy.py [--mib 32] [--reps 20] [--dir /dev/shm]

A checked block's output crosses the boundary as a file the worker writes (operations/codec.py). This
prints, per way of writing a CUDA tensor of --mib MiB (bf16) into a new file under --dir, the median
and best of --reps, in ms:

* `pageable mmap`: the file mapped (`np.lib.format.open_memmap`) and the tensor copied into its
  pages: one device-to-host copy into pageable memory that faults in every fresh page (the way
  before 2026-12-06);
* `cpu() + save`: `.cpu()` then `np.save` (a host copy, then a write);
* `codec (page-locked)`: what the worker does now (`codec.encode(..., host_only=True)`): a copy into
  a reused page-locked buffer, then one write(2);
* `d2h only`: the page-locked copy alone, the floor of any way.

Then the supervisor's side of a check, the file read back onto the device (the comparison runs where
the reference is):

* `decode + to(cuda)`: what the supervisor does (`codec.decode`, a copy-on-write mapping, then a
  host-to-device copy from those pageable pages);
* `readinto locked + to(cuda)`: the file's data read into a page-locked buffer, then copied over.

Each file is removed before the next is made, as the supervisor does after its comparison. Exits 0
(figures, not a gate); exits 2 where there is no CUDA device.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ms(fn: Callable[[Path], object], root: Path, reps: int) -> tuple[float, float]:
    walls = []
    for i in range(reps):
        d = Path(tempfile.mkdtemp(dir=root))
        t0 = time.perf_counter()
        fn(d / f"a{i}.npy")
        walls.append((time.perf_counter() - t0) * 1e3)
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    return statistics.median(walls), min(walls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dir", default="/dev/shm")
    a = ap.parse_args()
    import torch

    from cko_perf.operations import codec

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    t = torch.randn(a.mib << 19, device="cuda").to(torch.bfloat16)  # 2 bytes an element
    bits = t.view(torch.int16)
    pinned = torch.empty_like(bits, device="cpu", pin_memory=True)

    def mmap_way(p: Path) -> None:
        mm = np.lib.format.open_memmap(p, mode="w+", dtype=np.int16, shape=tuple(bits.shape))
        torch.from_numpy(mm).copy_(bits)
        del mm

    ways: dict[str, Callable[[Path], object]] = {
        "pageable mmap": mmap_way,
        "cpu() + save": lambda p: np.save(p, bits.cpu().numpy(), allow_pickle=False),
        "codec (page-locked)": lambda p: codec.encode({"t": t}, p.parent, host_only=True),
        "d2h only": lambda p: pinned.copy_(bits),
    }
    root = Path(tempfile.mkdtemp(dir=a.dir))
    print(f"{a.mib} MiB bf16 on {torch.cuda.get_device_name()}, {a.reps} reps into {a.dir}")
    print(f"{'way':28} {'median ms':>10} {'best ms':>9} {'GB/s':>7}")
    for name, fn in ways.items():
        fn(root / "warm.npy")  # first use: the page-locked buffer's allocation, the copy engines
        (root / "warm.npy").unlink(missing_ok=True)
        for p in root.iterdir():
            p.unlink()
        med, best = _ms(fn, root, a.reps)
        print(f"{name:28} {med:10.2f} {best:9.2f} {(a.mib << 20) / med / 1e6:7.1f}")
    (root / "back").mkdir()
    codec.encode({"t": t}, root / "back", host_only=True)
    back_file = root / "back" / "a0001.npy"
    locked = torch.empty(bits.numel(), dtype=torch.int16, pin_memory=True)

    def readinto_way() -> None:
        with open(back_file, "rb") as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            f.readinto(locked.numpy().data)
        locked.to("cuda").view(torch.bfloat16).sum().item()

    reads: dict[str, Callable[[], object]] = {
        "decode + to(cuda)": lambda: (
            codec.decode(root / "back", max_bytes=1 << 40, device_ok=False)["t"].to("cuda").sum().item()
        ),
        "readinto locked + to(cuda)": readinto_way,
    }
    for name, read in reads.items():
        read()
        walls = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            read()
            walls.append((time.perf_counter() - t0) * 1e3)
        med = statistics.median(walls)
        print(f"{name:28} {med:10.2f} {min(walls):9.2f} {(a.mib << 20) / med / 1e6:7.1f}")
    shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
