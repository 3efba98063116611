"""Benchmark cake's GQA (det, and the non-det ``cake_gqa_train`` when importable) side by
side with torch's ``scaled_dot_product_attention`` under its flash and cuDNN backends.

Per case ``B x S`` causal, Hq query heads, Hkv KV heads, head dim D: cake takes the
documents packed with ``cu_seqlens`` (and ``max_seqlen_*``), torch a batch ``[B, H, S, D]``
with K and V expanded to Hq heads outside the timing. Phases: ``fwd`` (no autograd) and
``fwd_bwd`` (forward with autograd, ``out.backward(do)``), ``triton.testing.do_bench``
medians of the whole Python call on CUDA (host time included), ``perf_counter`` on the
CPU. FLOPs: causal forward ``2 B Hq S^2 D``, fwd+bwd 3.5x that; ``pct_peak``: of
``--peak-tflops`` (790, the bf16 dense rate measured on an H200). ``bitwise_repeat``: the
sha256 of dQ, dK, dV over 5 fwd+bwd calls, equal or not.

GPU run (one H200; the three cases of docs/benchmarks/gqa.md)::

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) \\
        python3 packages/cake-gqa-det-train/benchmarks/bench_cake_gqa_det_train.py \\
        --out $OUT/gqa_bench.json

CPU smoke test (Triton interpreter, tiny shapes)::

    python3 .../bench_cake_gqa_det_train.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys

import torch
from cake_core.bench import (
    cuda_missing,
    device_description,
    do_bench_ms,
    error_record,
    free_memory,
    repeat_hashes,
    summarize_ms,
    time_calls,
    utc_now,
    write_json,
)

#: (B, S, Hq, Hkv, D): Qwen3-Next's attention (16 / 2 heads of 256), a Llama-like GQA at
#: D 128, one long document of 16 heads
CASES = [(4, 4096, 16, 2, 256), (4, 4096, 32, 8, 128), (1, 32768, 16, 16, 128)]
QUICK = [(2, 64, 4, 2, 64)]
IMPLS = ("cake_det", "cake_nondet", "sdpa_flash", "sdpa_cudnn", "sdpa_math")


def _inputs(B, S, Hq, Hkv, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B * S, Hq, D, generator=g).to(device, dtype) for _ in range(2))
    k, v = (torch.randn(B * S, Hkv, D, generator=g).to(device, dtype) for _ in range(2))
    cu = torch.arange(B + 1, dtype=torch.int32, device=device) * S
    return q, k, v, do, cu


def _impl(name, q, k, v, do, cu, B, S):
    """(fwd, fwd_bwd, grads) closures of one implementation."""
    Hq, D = q.shape[1], q.shape[2]
    if name.startswith("cake"):
        if name == "cake_det":
            from cake_gqa_det_train import gqa_det as fn
        else:
            from cake_gqa_train import gqa as fn
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

        def call():
            return fn(*leaves, cu, cu, max_seqlen_q=S, max_seqlen_k=S)
        dout = do
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
              "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_math": SDPBackend.MATH}[name]
        g = Hq // k.shape[1]
        leaves = [q.view(B, S, Hq, D).transpose(1, 2).detach().clone().requires_grad_()]
        leaves += [t.view(B, S, -1, D).repeat_interleave(g, 2).transpose(1, 2).detach()
                   .clone().requires_grad_() for t in (k, v)]
        dout = do.view(B, S, Hq, D).transpose(1, 2)

        def call():
            with sdpa_kernel(be):
                return torch.nn.functional.scaled_dot_product_attention(*leaves,
                                                                        is_causal=True)

    def fwd():
        with torch.no_grad():
            return call()

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        call().backward(dout)

    def grads():
        fwd_bwd()
        return [t.grad for t in leaves]
    return fwd, fwd_bwd, grads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--impls", default=",".join(IMPLS[:4]),
                    help=f"comma-separated, of {', '.join(IMPLS)}")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--out", default="", help="write the records as JSON here")
    args = ap.parse_args(argv)
    if cuda_missing(args.device):
        return 2
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    names = [n for n in args.impls.split(",") if n]
    bad = [n for n in names if n not in IMPLS]
    if bad:
        ap.error(f"unknown impls {bad}; known: {', '.join(IMPLS)}")
    if device == "cpu":  # torch's fused backends are CUDA only
        names = [n for n in names if n in ("cake_det", "cake_nondet", "sdpa_math")] \
            or ["cake_det"]
    records = []
    for B, S, Hq, Hkv, D in QUICK if args.quick else CASES:
        q, k, v, do, cu = _inputs(B, S, Hq, Hkv, D, dtype, device)
        flops = 2.0 * B * Hq * S * S * D
        rec = {"case": {"B": B, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D}, "impls": {}}
        for name in names:
            try:
                fwd, fwd_bwd, grads = _impl(name, q, k, v, do, cu, B, S)
                r = {}
                for phase, fn, mult in (("fwd", fwd, 1.0), ("fwd_bwd", fwd_bwd, 3.5)):
                    if device == "cuda":
                        t = do_bench_ms(fn, 25, 100 if not args.quick else 20)
                    else:
                        t = summarize_ms(time_calls(fn, 1, 2, device))
                    t["tflops"] = mult * flops / t["ms"] / 1e9
                    t["pct_peak"] = 100 * t["tflops"] / args.peak_tflops
                    r[phase] = t
                r["bitwise_repeat"] = len(set(repeat_hashes(
                    grads, ["dq", "dk", "dv"], runs=5 if device == "cuda" else 2))) == 1
                rec["impls"][name] = r
                print(f"{B}x{S} Hq {Hq} Hkv {Hkv} D {D} {name:12s} fwd "
                      f"{r['fwd']['ms']:.3f} ms fwd+bwd {r['fwd_bwd']['ms']:.3f} ms "
                      f"({r['fwd_bwd']['tflops']:.0f} TFLOP/s) repeat "
                      f"{r['bitwise_repeat']}", flush=True)
            except Exception as e:  # noqa: BLE001 - an anchor missing on this machine
                rec["impls"][name] = error_record(e)
                print(f"{name}: {e}", flush=True)
            free_memory(device)
        det = rec["impls"].get("cake_det", {}).get("fwd_bwd", {}).get("ms")
        for r in rec["impls"].values():
            if det and "fwd_bwd" in r:
                r["fwd_bwd_vs_cake_det"] = r["fwd_bwd"]["ms"] / det
        records.append(rec)
    write_json(args.out, {"when": utc_now(), "device": device_description(device),
                          "torch": torch.__version__, "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
