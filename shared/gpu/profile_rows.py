"""The measuring loop shared by the kernel-by-kernel scripts (gdn_kernels.py,
kda_kernels.py): one step's CUDA kernels under ``torch.profiler``, the ``do_bench`` time
and the printed table, the difference of a variant's outputs to the rule's and a hash of
their bits (to compare trees or processes). Imported
from this folder, which is the running script's own (``sys.path[0]``)."""
from __future__ import annotations

import hashlib
from collections import defaultdict

import torch
import triton.testing
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


def bench_and_profile(label, step, *, by_name=False, keep=None):
    """Three warm-up steps, the ``do_bench`` median (ms) of ``step`` (one fwd+bwd), then
    one profiled step; prints ``== label: fwd+bwd ... ms; profiled kernels ... us (n), idle
    ... us`` and the kernels: per name summed over launches, largest first (``by_name``),
    or in launch order with the gap before each (only names containing one of ``keep``'s
    strings when given). Returns the median."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(step, warmup=50, rep=300)
    rows, idle = kernel_rows(step)
    tot = sum(r[1] for r in rows)
    print(f"== {label}: fwd+bwd {ms:.3f} ms; profiled kernels {tot:.0f} us ({len(rows)}), "
          f"idle {idle:.0f} us", flush=True)
    if by_name:
        per = defaultdict(lambda: [0.0, 0])
        for kname, us, _ in rows:
            per[kname][0] += us
            per[kname][1] += 1
        for kname, (us, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            print(f"   {us:8.1f} us  x{n:<3d} {kname}")
    else:
        for kname, us, gap in rows:
            if keep is None or any(s in kname for s in keep):
                print(f"   {us:8.1f} us  gap {gap:6.1f}  {kname}")
    return ms


def max_rel_diff(got, ref):
    """Largest ``max |a - r| / max |r|`` over the pairs of ``got`` and ``ref`` (tensors,
    ``None`` where an output is absent in both)."""
    return max(float((a.detach().float() - r.detach().float()).abs().max()
                     / r.detach().float().abs().max().clamp_min(1e-30))
               for a, r in zip(got, ref, strict=True) if a is not None)


def bits_hash(tensors):
    """The first 16 hex digits of a sha256 over the bits of the non-None tensors, in order
    (equal hashes: the same bits, across processes and trees)."""
    from cake_core.testing import bits

    h = hashlib.sha256()
    for t in tensors:
        if t is not None:
            h.update(bits(t.detach().contiguous()).cpu().numpy().tobytes())
    return h.hexdigest()[:16]
