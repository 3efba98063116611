"""Localise a KDA error seen on the GPU: the fp16 parity case of
tests/test_kda_parity.py::test_16bit_inputs with one thing changed at a time; prints the
max relative error of o, the final state and every gradient per variant.

    PYTHONPATH=...:packages/cake-kda-det-train/tests python shared/gpu/kda_diag.py
"""
import dataclasses
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
import conftest as kda  # noqa: E402
from cake_kda_det_train import chunk_kda_det, make_plan  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_configs import force_num_stages  # noqa: E402

force_num_stages()

DEV = kda.DEV


def case(name, dtype=torch.float16, K=32, V=32, l2=True, gate=True, bsig=True, pdtype=None,
         plan_over=None, T=70, H=2, HV=4):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, T, H, HV, K, V, dtype, seed=19, h0=True,
                                               g_mode="raw" if gate else "real",
                                               raw_beta=bsig, normalize_k=not l2)
    A_log, dt_bias = kda.make_gate_params(HV, K, seed=20, dtype=pdtype or dtype)
    if not gate:
        A_log = dt_bias = None
    plan = make_plan(K, V, dtype, "cuda")
    if plan_over:
        plan = dataclasses.replace(plan, **plan_over)
    kw = dict(use_qk_l2norm_in_kernel=l2, use_gate_in_kernel=gate,
              use_beta_sigmoid_in_kernel=bsig)
    do = kda.randn(v.shape, dtype, DEV, seed=119)
    dht = kda.randn((1, HV, K, V), torch.float32, DEV, seed=120)
    try:
        o, ht, got = kda.run_autograd(chunk_kda_det, (q, k, v, g, beta), (h0, A_log, dt_bias),
                                      do, dht, plan=plan, **kw)
        d64 = [t.double() if t is not None else None for t in (h0, A_log, dt_bias)]
        o_r, ht_r, want = kda.run_autograd(kda.reference64,
                                           [t.double() for t in (q, k, v, g, beta)], d64,
                                           do.double(), dht.double(), **kw)
        errs = []
        for n, a, b in [("o", o, o_r), ("ht", ht, ht_r)] + list(zip(kda.NAMES, got, want, strict=True)):
            if a is None or b is None:
                continue
            e = float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
            errs.append(f"{n}={e:.1e}" + ("" if torch.isfinite(a).all() else "(nonfinite)"))
        print(f"{name:32s}", " ".join(errs), flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name:32s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    which = sys.argv[1:] or None
    variants = {
        "as-test": {},
        "no-l2": dict(l2=False),
        "no-gate": dict(gate=False),
        "no-bsig": dict(bsig=False),
        "none": dict(l2=False, gate=False, bsig=False),
        "fp32-params": dict(pdtype=torch.float32),
        "bf16": dict(dtype=torch.bfloat16),
        "fp32": dict(dtype=torch.float32),
        "store32": dict(plan_over=dict(store_16bit=0)),
        "K64V64": dict(K=64, V=64),
        "H1HV1": dict(H=1, HV=1),
        "T64": dict(T=64),
        "gate_bt16": dict(plan_over=dict(gate_block_t=16)),
        "stages1": dict(plan_over=dict(num_stages_h=1)),
        "dots_ieee": dict(plan_over=dict(fp32_dots=1)),
        "warps_prep8": dict(plan_over=dict(num_warps_prep=8)),
        "warps_o8": dict(plan_over=dict(num_warps_o=8)),
        "warps_bwd8": dict(plan_over=dict(num_warps_bwd=8)),
        "K64V32": dict(K=64, V=32),
        "K32V64": dict(K=32, V=64),
        "K128V32": dict(K=128, V=32, dtype=torch.bfloat16),
        "K32V128": dict(K=32, V=128, dtype=torch.bfloat16),
        "K16V64": dict(K=16, V=64),
    }
    for name, kw in variants.items():
        if which is None or name in which:
            case(name, **kw)
