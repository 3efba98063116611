"""LM-head loss candidates against the rule's plan on one GPU (issue 46: at most QuACK's
time at T 4096, H 4096, V 128256, bf16, fwd+bwd; peak no higher than the rule's).

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python shared/gpu/lmhead_candidates.py \
        [T,H,V ...]

Per shape: the three cuBLAS GEMMs alone (logits fp32-out, dhidden, dweight: the floor the
issue names), then each candidate timed fwd+bwd: the rule's plan; its dweight GEMM through
cake-core's TMA-descriptor kernel (``matmul(..., tma=True)``, the package's ``_gemm_kw``
patched here: the candidate lives in this script until the rule adopts it); the same with
4 stages. Each with ``triton.testing.do_bench`` (a fresh forward and ``torch.autograd.grad``
of the mean loss to hidden and weight), its peak memory above the inputs, its dweight's
distance to the rule's and whether two calls give equal bits. Dev tooling, ships in no wheel.
"""
from __future__ import annotations

import dataclasses
import sys

import cake_lm_head_loss_det_train.api as lm_api
import torch
from cake_lm_head_loss_det_train import lm_head_loss_det, make_plan
from triton.testing import do_bench

SHAPES = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or [(4096, 4096, 128256)]
# name: (plan changes, dweight GEMM through the TMA kernel)
CANDIDATES = {"rule": ({}, False), "dw tma": ({}, True),
              "dw tma, 4 stages": (dict(gemm_stages=4), True)}
_GEMM_KW = lm_api._gemm_kw


def _gemm_kw_tma(plan, which):
    kw = _GEMM_KW(plan, which)
    if which == "dw":
        kw["tma"] = True
    return kw


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for T, H, V in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        h = (torch.randn(T, H, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_()
        w = (torch.randn(V, H, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
        y = torch.randint(0, V, (T,), device="cuda", generator=g)
        lg = torch.empty(T, V, dtype=torch.bfloat16, device="cuda")
        floor = (do_bench(lambda: torch.mm(h, w.t(), out_dtype=torch.float32))
                 + do_bench(lambda: torch.mm(lg, w)) + do_bench(lambda: torch.mm(lg.t(), h)))
        print(f"T {T} H {H} V {V}: the three cuBLAS GEMMs {floor:.3f} ms", flush=True)
        del lg
        base = make_plan(H, V, torch.bfloat16, h.device)
        ref_dw = None
        for name, (change, tma) in CANDIDATES.items():
            plan = dataclasses.replace(base, **change)
            lm_api._gemm_kw = _gemm_kw_tma if tma else _GEMM_KW

            def step(plan=plan):
                loss = lm_head_loss_det(h, w, y, plan=plan)
                return torch.autograd.grad(loss, (h, w))
            try:
                a = step()
                b = step()
                torch.cuda.synchronize()
                same = all(torch.equal(x, z) for x, z in zip(a, b, strict=True))
                if ref_dw is None:
                    ref_dw = a[1].float()
                gap = (a[1].float() - ref_dw).abs().max().item()
                del a, b
                torch.cuda.reset_peak_memory_stats()
                start = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - start) / 2**20
                ms = do_bench(step)
                print(f"  {name:18s} fwd+bwd {ms:8.3f} ms  / floor {ms / floor:5.2f}  peak "
                      f"{peak:7.0f} MiB  max |dW - rule dW| {gap:.2e}  repeats {same}",
                      flush=True)
            except Exception as e:  # noqa: BLE001  (one candidate's failure: the others run)
                print(f"  {name:18s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
