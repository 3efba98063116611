"""One step's CUDA kernels under ``torch.profiler``, for the kernel-by-kernel scripts
(gdn_kernels.py, kda_kernels.py): imported from this folder, which is the running script's
own (``sys.path[0]``)."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_rows(step):
    """Run ``step`` once under the profiler; return ``(rows, idle)``: per CUDA kernel in
    launch order ``(name[:72], device_us, gap_us_before_it)``, and the summed gaps."""
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    ks = sorted((e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    rows, end, idle = [], None, 0.0
    for e in ks:
        gap = 0.0 if end is None else max(0.0, e.time_range.start - end)
        idle += gap
        end = e.time_range.end
        rows.append((e.name[:72], e.device_time, gap))
    return rows, idle
