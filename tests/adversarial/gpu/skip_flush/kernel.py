"""The original's eager maths, timed on a warm L2 in cold blocks: at import it makes the worker's L2
flush a no-op (the worker's clock code runs in this process), and re-reads its staged inputs right
before each window opens, so that whatever eviction happened before, they are back in L2.

What it meets: in cold blocks on a GPU the supervisor evicts L2 from its own CUDA context after the
worker staged and before the window (wire.Run flush "supervisor"), so the no-op has nothing to skip;
the re-read is the subject's own GPU work inside the supervisor's bracket, at least as long as the
HBM reads it saves, which the clock rules hold against the reference (clock_unconfirmed,
clock_hidden_time)."""

import torch

from operations import timing, worker

timing.TorchCuda.flush_l2 = lambda self: None
timing.DeviceEvents.flush_l2 = lambda self: None

_real_window = worker.Worker._window


def _rewarm(self, fns, captured, stage, mode):
    for inputs in self.inputs or []:
        for v in inputs.values() if isinstance(inputs, dict) else [inputs]:
            if isinstance(v, torch.Tensor) and v.is_cuda:
                v.sum()  # a read of every byte: into L2 on its way
    return _real_window(self, fns, captured, stage, mode)


worker.Worker._window = _rewarm


def layer_norm(x, weight, bias, eps=1e-5):
    xf = x.float()
    xc = xf - xf.mean(dim=-1, keepdim=True)
    return (xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps) * weight.float() + bias.float()).to(
        x.dtype
    )
