"""The H200's two ceilings, measured bare on the host with torch: device-to-device copy bandwidth
(bytes read + written) and the bf16 matrix-product rate, medians of timed repeats after warm-up."""

import json
import sys

import torch


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    out.sort()
    return out[len(out) // 2]


src = torch.randn(2 << 30 >> 2, device="cuda")  # 2 GiB fp32
dst = torch.empty_like(src)
t = timed(lambda: dst.copy_(src))
copy_bw = 2 * src.numel() * 4 / t
n = 8192
x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
t2 = timed(lambda: x @ y)
rate = 2 * n**3 / t2
doc = {"copy_bytes_per_s": copy_bw, "bf16_flops_per_s": rate, "gpu": torch.cuda.get_device_name(0)}
json.dump(doc, sys.stdout)
print()
print(f"ceilings: copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s", file=sys.stderr)
