"""Where the main job's GPU time goes: one training step of cake-tinylm's model, cake's
modules against torch's, kernel by kernel (issue 45: with the step in a CUDA graph the host
time is gone, so the tokens/s of the two builds differ by their kernels' GPU time).

    python shared/gpu/tinylm_kernels.py [--dtype bfloat16] [--steps 5] [--top 15]
    python shared/gpu/tinylm_kernels.py --tiny     # a CPU check of the script (CPU events)

Builds the CUDA default model (``cake_tinylm.train.CUDA_DEFAULTS``: d_model 512, 6 layers,
8 heads of 64, 32 x 512 bytes) twice from one seed, ``impl="cake"`` and ``impl="torch"``;
runs 3 warm-up steps (forward, backward, AdamW with foreach: the same for both sides, not
the job's parameter groups) and profiles ``--steps`` more under
``torch.profiler``. Prints per implementation the device time per step and its kernels by
total time (name, calls per step, us per step, share), then the two totals side by side.
fp32 matmuls as the job runs them (torch's defaults: cuBLAS SGEMM, not TF32).
"""
from __future__ import annotations

import argparse
import collections

import torch


def _step_fn(model, opt, x, y):
    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
    return step


def profile(impl: str, cfg, dtype, device, steps: int):
    from cake_tinylm.model import ModelConfig, build_model

    torch.manual_seed(0)
    mcfg = ModelConfig(d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                       n_heads=cfg["n_heads"], max_seq_len=cfg["seq_len"])
    model = build_model(mcfg, impl, device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (cfg["batch_size"], cfg["seq_len"]), generator=g).to(device)
    y = torch.randint(0, 256, (cfg["batch_size"], cfg["seq_len"]), generator=g).to(device)
    step = _step_fn(model, opt, x, y)
    for _ in range(3):
        step()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        torch.cuda.synchronize()
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        on_dev = e.device_type == torch.autograd.DeviceType.CUDA
        if on_dev != (device.type == "cuda") or (not on_dev and e.cpu_parent is not None):
            continue  # CUDA kernels on a GPU; top-level CPU ops in the CPU check
        t = e.device_time if on_dev else e.cpu_time
        per[e.name][0] += 1
        per[e.name][1] += t
    return {n: (c / steps, us / steps) for n, (c, us) in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tiny", action="store_true", help="small model on the CPU")
    a = ap.parse_args()
    from cake_tinylm.train import CUDA_DEFAULTS

    cfg = dict(CUDA_DEFAULTS)
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    if a.tiny:
        cfg.update(d_model=64, n_layers=2, n_heads=4, seq_len=32, batch_size=2)
    # torch's defaults, as the job runs: fp32 matmuls in cuBLAS SGEMM, not TF32
    dtype = getattr(torch, a.dtype)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {a.dtype}, {cfg}")
    totals = {}
    for impl in ("cake", "torch"):
        rows = profile(impl, cfg, dtype, device, a.steps)
        total = sum(us for _, us in rows.values())
        totals[impl] = total
        print(f"\n== {impl}: {total / 1e3:.3f} ms {'device' if device.type == 'cuda' else 'CPU'}"
              f" time per step, {sum(c for c, _ in rows.values()):.0f} events")
        for n, (c, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:a.top]:
            print(f"{us:10.1f} us {100 * us / total:5.1f}% {c:5.0f}x  {n[:110]}")
    print(f"\ncake / torch time per step: {totals['cake'] / totals['torch']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
