"""Build the KDA chunk kernels for sm_90 without a GPU and print what the builds say:
registers, stack (spills), shared memory, and counts of SASS instructions (shared-memory
loads and stores, barriers, tensor-core ops, global loads, MUFU = exp).

    TRITON_INTERPRET=0 python benchmarks/offline_build_kda.py [--K 128] [--V 128] [--plan k=v ...]

Uses Triton's own compiler and its bundled ptxas / cuobjdump (target sm_90, CUDA 12-ish
PTX), the default CUDA plan of ``make_plan(K, V, bf16, "cuda")`` (built without a device:
the rule is plain Python) with ``--plan`` overrides, and compiles each chunk kernel of the
forward and the backward.
Static counts, not timings: a guide to where a candidate removes work, to be confirmed on
the GPU. Needs ``TRITON_INTERPRET=0`` on a machine without CUDA (else cake picks the
interpreter); no GPU is used.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import subprocess
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this builds real sm_90 code")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SASS_GROUPS = {
    "LDS": r"\bLDS(\.|\s)", "STS": r"\bSTS(\.|\s)", "BAR": r"\bBAR(\.|\s)",
    "HMMA/WGMMA": r"\b(HMMA|HGMMA|WGMMA)", "LDG": r"\bLDG(\.|\s)", "STG": r"\bSTG(\.|\s)",
    "MUFU": r"\bMUFU(\.|\s)", "SHFL": r"\bSHFL(\.|\s)", "LDL/STL (spill)": r"\b(LDL|STL)(\.|\s)",
}


#: the heads and dims of the build; a kernel that takes H, HV, GROUP, KD or VD as
#: ``tl.constexpr`` (the state kernels of cake_core.chunk_state) gets them from here
SHAPE = {}


def _sig(fn, types: dict, consts: dict):
    consts = {**{p.name: SHAPE[p.name] for p in fn.params
                 if p.is_constexpr and p.name in SHAPE}, **consts}
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in consts else types[name]
    return ASTSource(fn, sig, constexprs=consts)


def build(fn, types, consts, num_warps, num_stages=1):
    k = triton.compile(_sig(fn, types, consts), target=TARGET,
                       options={"num_warps": num_warps, "num_stages": num_stages})
    cubin = k.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
    res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    os.unlink(path)
    use = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
    counts = collections.OrderedDict(
        (g, len(re.findall(p, sass))) for g, p in SASS_GROUPS.items())
    counts["SASS lines"] = sum(1 for line in sass.splitlines()
                               if re.match(r"\s+/\*[0-9a-f]{4}", line))
    return use.get("REG"), use.get("STACK"), k.metadata.shared, counts


def main():
    import torch
    from cake_core.chunk_output import chunk_output_kernel
    from cake_core.chunk_state import chunk_state_bwd_kernel, chunk_state_fwd_kernel
    from cake_kda_det_train.kernels.chunk_bwd import (
        kda_bwd_intra_kernel,
        kda_bwd_intra_tok_kernel,
        kda_bwd_local_kernel,
    )
    from cake_kda_det_train.kernels.chunk_fwd import (
        kda_chunk_cumsum_kernel,
        kda_fwd_inv_kernel,
        kda_fwd_pairs_kernel,
        kda_fwd_pairs_tok_kernel,
        kda_fwd_prep_kernel,
    )
    from cake_kda_det_train.plan import _rule

    p = argparse.ArgumentParser()
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--plan", nargs="*", default=[])
    p.add_argument("--fwd-only", action="store_true",
                   help="only the forward's kernels (cumsum, pairs, prep, state, output)")
    a = p.parse_args()
    SHAPE.update(H=16, HV=16, GROUP=1, KD=a.K, VD=a.V)
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in a.plan}
    plan = dataclasses.replace(_rule(a.K, a.V, torch.bfloat16, torch.device("cuda")), **over)
    dt, prec = triton.language.bfloat16, ("tf32", "ieee", "tf32x3")[plan.fp32_dots]
    bvf = triton.next_power_of_2(max(16, a.V))
    ints = {n: "i32" for n in ("H", "HV", "GROUP", "KD", "VD")}
    rows = []
    prep_t = {**ints, "Kp": "*bf16", "Vp": "*bf16", "GCUM": "*fp32", "BETA": "*fp32",
              "CHUNK_START": "*i32", "CHUNK_END": "*i32", "Ap": "*bf16", "W": "*bf16",
              "U": "*bf16", "KG": "*bf16"}
    c = dict(BT=64, BKI=plan.block_k_inner, GATE=True, HAS_A=True, HAS_BIAS=True,
             LOWER_BOUND=False, THRESHOLD=20.0)  # Kimi Linear's gate
    rows.append(("fwd cumsum", 4,
                 *build(kda_chunk_cumsum_kernel,
                        {"Gp": "*bf16", "GCUM": "*fp32", "CHUNK_START": "*i32",
                         "CHUNK_END": "*i32", "A_LOG": "*fp32", "DT_BIAS": "*fp32",
                         "lower_bound": "fp32", "HV": "i32", "KD": "i32"}, c,
                        4)))
    pt = {n: "i32" for n in ("H", "HV", "GROUP", "KD")}
    pt.update({"Qp": "*bf16", "Kp": "*bf16", "GCUM": "*fp32", "CHUNK_START": "*i32",
               "CHUNK_END": "*i32", "AKKS": "*fp32", "AQK": "*bf16", "scale": "fp32"})
    c = dict(DT=dt, PREC=prec, BT=64, BC=16, BKI=plan.block_k_inner)
    rows.append(("fwd pairs", 4,
                 *build(kda_fwd_pairs_kernel, pt, c, 4)))
    c = dict(BT=64, BC=16, BKF=triton.next_power_of_2(max(16, a.K)), BH=plan.tok_heads)
    rows.append(("fwd pairs tok", plan.num_warps_tok,
                 *build(kda_fwd_pairs_tok_kernel, pt, c, plan.num_warps_tok)))
    it_t = {"AKKS": "*fp32", "BETA": "*fp32", "CHUNK_START": "*i32", "CHUNK_END": "*i32",
            "Ap": "*bf16", "HV": "i32"}
    rows.append(("fwd inverse", 2,
                 *build(kda_fwd_inv_kernel, it_t, dict(PREC=prec, BT=64, BC=16, LOG2_BC=4),
                        2)))
    c = dict(DT=dt, PREC=prec, BT=64, BKI=plan.block_k_inner, BVF=bvf)
    rows.append(("prep (w, u, kg)", plan.num_warps_prep,
                 *build(kda_fwd_prep_kernel, prep_t, c, plan.num_warps_prep)))
    bk = triton.next_power_of_2(max(16, a.K))
    hc = dict(DT=dt, PREC=prec, BT=64, BK=bk, BV=plan.block_v)
    # the state kernels' V block is block_v_h (format 9), the output kernel's block_v
    sc = dict(hc, BV=plan.block_v_h, GK=True, V_DECAY=False, FLAT=False)
    h_t = {n: "i32" for n in ("H", "HV", "GROUP", "KD", "VD")}
    h_t.update({"Kp": "*bf16", "W": "*bf16", "U": "*bf16", "GCUM": "*fp32", "CU": "*i32",
                "CHUNK_OFF": "*i32", "H0": "*fp32", "HBUF": "*bf16", "VNEW": "*bf16",
                "HT": "*fp32"})
    rows.append((f"fwd state h (stages={plan.num_stages_h})", plan.num_warps_h,
                 *build(chunk_state_fwd_kernel, h_t, dict(sc, HAS_H0=True, STORE_FINAL=True),
                        plan.num_warps_h, plan.num_stages_h)))
    o_t = {n: "i32" for n in ("H", "HV", "GROUP", "KD", "VD")}
    o_t.update({"Qp": "*bf16", "GCUM": "*fp32", "AQK": "*bf16", "VNEW": "*bf16",
                "HBUF": "*bf16", "CHUNK_START": "*i32", "CHUNK_END": "*i32", "O": "*bf16",
                "scale": "fp32"})
    rows.append(("fwd output o", plan.num_warps_o,
                 *build(chunk_output_kernel, {**o_t, "Kp": "*bf16"}, dict(hc, GK=True),
                        plan.num_warps_o)))
    if a.fwd_only:
        _report(over, rows)
        return
    dh_t = {n: "i32" for n in ("H", "HV", "GROUP", "KD", "VD")}
    dh_t.update({"Qp": "*bf16", "Kp": "*bf16", "W": "*bf16", "GCUM": "*fp32", "AQK": "*bf16",
                 "DO": "*bf16", "CU": "*i32", "CHUNK_OFF": "*i32", "DHT": "*fp32",
                 "DH": "*bf16", "DV": "*bf16", "DH0": "*fp32", "scale": "fp32"})
    rows.append((f"bwd state dh (stages={plan.num_stages_dh})", plan.num_warps_dh,
                 *build(chunk_state_bwd_kernel, dh_t, dict(sc, HAS_DHT=True, STORE_DH0=True),
                        plan.num_warps_dh, plan.num_stages_dh)))
    loc_t = {**ints, "Qp": "*bf16", "Kp": "*bf16", "Vp": "*bf16", "BETA": "*fp32",
             "GCUM": "*fp32", "Ap": "*bf16", "HBUF": "*bf16", "DH": "*bf16", "DO": "*bf16",
             "VNEW": "*bf16", "DU": "*bf16", "CHUNK_START": "*i32", "CHUNK_END": "*i32",
             "DQ": "*fp32", "DK": "*fp32", "DV": "*fp32", "DG": "*fp32", "DBETA": "*fp32",
             "PS": "*fp32", "scale": "fp32"}
    c = dict(DT=dt, PREC=prec, BT=64, BC=16, BKI=plan.block_k_bwd, BV=plan.block_v_bwd,
             NV=-(-a.V // plan.block_v_bwd))
    rows.append(("bwd chunk (local)", plan.num_warps_bwd,
                 *build(kda_bwd_local_kernel, loc_t, c, plan.num_warps_bwd)))
    it = {n: "i32" for n in ("H", "HV", "GROUP", "KD")}
    it.update({"Qp": "*bf16", "Kp": "*bf16", "BETA": "*fp32", "GCUM": "*fp32",
               "PS": "*fp32", "CHUNK_START": "*i32", "CHUNK_END": "*i32", "DQ": "*fp32",
               "DK": "*fp32", "DG": "*fp32", "DBETA": "*fp32"})
    c = dict(DT=dt, PREC=prec, BT=64, BC=16, BKI=plan.block_k_inner)
    rows.append(("bwd intra", 4,
                 *build(kda_bwd_intra_kernel, it, c, 4)))
    c = dict(BT=64, BC=16, BKF=triton.next_power_of_2(max(16, a.K)), BH=plan.tok_heads_bwd,
             L2=True)  # Kimi Linear's q/k L2 norm: its backward in this kernel
    it = dict(it, DQO="*bf16", DKO="*bf16",  # one value head per q/k head
              RQ="*fp32", RK="*fp32")
    rows.append(("bwd intra tok", plan.num_warps_tok_bwd,
                 *build(kda_bwd_intra_tok_kernel, it, c, plan.num_warps_tok_bwd)))
    _report(over, rows)


def _report(over, rows):
    print("plan over", over)
    for what, warps, regs, spills, smem, counts in rows:
        print(f"{what:22s} warps={warps} regs={regs} stack={spills} smem={smem} "
              + " ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
