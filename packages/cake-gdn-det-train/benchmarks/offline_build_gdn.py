"""Build the GDN chunk kernels for sm_90 without a GPU and print what the builds say:
registers, stack (spills), shared memory, and counts of SASS instructions (shared-memory
loads and stores, barriers, tensor-core ops, global loads and stores, MUFU = exp, async
copies, register moves between layouts via shared memory show up as LDS/STS + BAR).

    TRITON_INTERPRET=0 python benchmarks/offline_build_gdn.py [--K 128] [--V 128] [--align]
        [--plan k=v ...]

Uses Triton's own compiler and its bundled cuobjdump (target sm_90), the default CUDA plan
of ``make_plan(K, V, bf16, "cuda")``'s rule (plain Python, no device) with ``--plan``
overrides, and compiles the two chunk-recurrence kernels (``fwd_h``, ``bwd_dh``: those of
cake_core.chunk_state in the plan's ``rec_form``),
the chunk prep (forward, and the backward's with the kept T), the output kernel and the
backward chunk-local kernel (with ``local_form = 2`` the three kernels of
kernels/bwd_local_kblock.py instead of bwd_local).
Static counts (each loop body once), not timings: a guide to where a candidate removes
work, to be confirmed on the GPU. ``--align`` gives the arguments the divisibility hints a
launch gives them (16-byte aligned pointers; H = HV = 32 and K, V where multiples of 16):
without it the loads are not vectorised and the builds spill where a real launch does not
(static counts; the GPU timings are in docs/benchmarks/gdn.md).
Needs ``TRITON_INTERPRET=0`` on a machine without CUDA (else cake picks the interpreter).
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
    "MMA": r"\b(HMMA|HGMMA|WGMMA)", "LDG": r"\bLDG(\.|\s)", "STG": r"\bSTG(\.|\s)",
    "LDGSTS": r"\bLDGSTS(\.|\s)", "MUFU": r"\bMUFU(\.|\s)", "SHFL": r"\bSHFL(\.|\s)",
    "LDL/STL": r"\b(LDL|STL)(\.|\s)",
}


#: with ``--align``: the int arguments marked divisible by 16 when their value is (as
#: Triton's launcher specializes them at run time; every pointer is marked too)
ALIGN = {}
#: the heads and dims of the build (case a's); a kernel that takes H, HV, GROUP, KD or VD as
#: ``tl.constexpr`` (the state kernels; the rule's kernels at 16-bit K = 128, local_form 2,
#: since 2026-12-03; the others take them at run time) gets them from here
SHAPE = {}


def build(fn, types: dict, consts: dict, num_warps: int, num_stages: int = 1):
    """Compile ``fn`` for sm_90; return (registers, stack bytes, shared bytes, counts)."""
    consts = {**{p.name: SHAPE[p.name] for p in fn.params
                 if p.is_constexpr and p.name in SHAPE}, **consts}
    sig = {n: "constexpr" if n in consts else types[n] for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in consts and (types[n].startswith("*") and ALIGN or ALIGN.get(n))}
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=TARGET,
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
        path = f.name
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
    res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    os.unlink(path)
    use = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
    counts = collections.OrderedDict(
        (g, len(re.findall(p, sass))) for g, p in SASS_GROUPS.items())
    counts["SASS"] = sum(1 for line in sass.splitlines()
                         if re.match(r"\s+/\*[0-9a-f]{4}", line))
    return use.get("REG"), use.get("STACK"), k.metadata.shared, counts


def main():
    import torch
    from cake_core.chunk_output import chunk_output_kernel
    from cake_core.chunk_state import chunk_state_bwd_kernel, chunk_state_fwd_kernel
    from cake_gdn_det_train.kernels.bwd_dv_local import gdn_bwd_dv_local_kernel
    from cake_gdn_det_train.kernels.bwd_local import gdn_bwd_local_kernel
    from cake_gdn_det_train.kernels.bwd_local_kblock import (
        gdn_bwd_local_dk_kernel,
        gdn_bwd_local_kblock_kernel,
        gdn_bwd_local_wy_kb_kernel,
    )
    from cake_gdn_det_train.kernels.fwd_prep import gdn_fwd_prep_kernel
    from cake_gdn_det_train.plan import _rule

    p = argparse.ArgumentParser()
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--plan", nargs="*", default=[])
    p.add_argument("--only", default="", help="comma list: fwd_h,bwd_dh,prep,o,local")
    p.add_argument("--align", action="store_true",
                   help="mark pointers, and H = HV = 32, K, V where multiples of 16, divisible "
                        "by 16, as a launch at case a specializes them (off: no such hints, "
                        "as the builds recorded before 2026-11-30 evening)")
    a = p.parse_args()
    if a.align:
        ALIGN.update(H=True, HV=True, KD=a.K % 16 == 0, VD=a.V % 16 == 0)
    SHAPE.update(H=16, HV=32, GROUP=2, KD=a.K, VD=a.V)
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in a.plan}
    plan = dataclasses.replace(_rule(a.K, a.V, torch.bfloat16, torch.device("cuda")), **over)
    only = set(a.only.split(",")) if a.only else {"fwd_h", "bwd_dh", "prep", "o", "local"}
    dt, prec = triton.language.bfloat16, plan.dot_precision
    bvf = triton.next_power_of_2(max(16, a.V))
    ints = {n: "i32" for n in ("H", "HV", "GROUP", "KD", "VD")}
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    base = dict(DT=dt, PREC=prec, BT=64, BK=plan.block_k)
    rows = []
    # the state kernels' form (api._rec_opts); their shape is constexpr (SHAPE)
    rec = dict(GK=False, V_DECAY=plan.rec_form == 1, FLAT=plan.rec_form == 1)
    if "fwd_h" in only:
        t = {**ints, "Kp": bf, "W": bf, "U": bf, "GCUM": f32, "CU": i32, "CHUNK_OFF": i32,
             "H0": f32, "HBUF": bf, "VNEW": bf, "HT": f32}
        c = dict(base, BV=plan.block_v_h, HAS_H0=True, STORE_FINAL=True, **rec)
        rows.append(("fwd_h", plan.num_warps_h,
                     *build(chunk_state_fwd_kernel, t, c, plan.num_warps_h, plan.num_stages_h)))
    if "bwd_dh" in only:
        t = {**ints, "Qp": bf, "Kp": bf, "W": bf, "GCUM": f32, "AQK": f32, "DO": bf, "CU": i32,
             "CHUNK_OFF": i32, "DHT": f32, "DH": bf, "DV": bf, "DH0": f32, "scale": "fp32"}
        c = dict(base, BV=plan.block_v_h, HAS_DHT=True, STORE_DH0=True, **rec)
        rows.append(("bwd_dh", plan.num_warps_h,
                     *build(chunk_state_bwd_kernel, t, c, plan.num_warps_h, plan.num_stages_h)))
    if "prep" in only:
        t = {**ints, "Kp": bf, "Vp": bf, "Gp": f32, "BETA": f32, "CHUNK_START": i32,
             "CHUNK_END": i32, "GCUM": f32, "Ap": bf, "W": bf, "U": bf}
        for load_a in (False, True):
            c = dict(base, LOG2_BT=6, BVF=bvf, LOAD_A=load_a)
            rows.append(("prep (kept T)" if load_a else "prep", 4,
                         *build(gdn_fwd_prep_kernel, t, c, 4)))
    if "o" in only:
        t = {**ints, "Qp": bf, "Kp": bf, "VNEW": bf, "GCUM": f32, "AQK": f32, "HBUF": bf,
             "CHUNK_START": i32, "CHUNK_END": i32, "O": bf, "scale": "fp32"}
        rows.append(("fwd_o", 4, *build(chunk_output_kernel, t,
                                        dict(base, BV=plan.block_v, GK=False), 4)))
        t = {**ints, "Qp": bf, "Kp": bf, "GCUM": f32, "DO": bf, "CHUNK_START": i32,
             "CHUNK_END": i32, "DVL": bf, "scale": "fp32"}
        rows.append(("bwd_dv_local", 4,
                     *build(gdn_bwd_dv_local_kernel, t, dict(base, BV=plan.block_v), 4)))
    if "local" in only:
        t = {**ints, "Qp": bf, "Kp": bf, "Vp": bf, "BETA": f32, "GCUM": f32, "Ap": bf,
             "HBUF": bf, "DH": bf, "DO": bf, "DVNEW": bf, "VNEW": bf, "CHUNK_START": i32,
             "CHUNK_END": i32, "DQ": f32, "DK": f32, "DV": f32, "DG": f32, "DBETA": f32,
             "scale": "fp32"}
        if plan.local_form:  # 2: kernels/bwd_local_kblock.py, at the plan's warps and 4
            bk = plan.block_k_local
            c = dict(base, BK=bk, NK=-(-a.K // bk), BV=plan.block_v_local,
                     NV=-(-a.V // plan.block_v_local))
            tk = {**t, "WT": f32, "WV": f32, "NT": "i32"}
            for w in sorted({plan.num_warps_local, 4}, reverse=True):
                rows.append(("bwd_local_kblock", w,
                             *build(gdn_bwd_local_kblock_kernel, tk, c, w)))
            for w in (8, 4):
                rows.append(("bwd_local_wy_kb", w,
                             *build(gdn_bwd_local_wy_kb_kernel, {**tk, "DZ": f32}, c, w)))
            t = {n: "i32" for n in ("H", "HV", "GROUP", "KD")}
            t.update(Kp=bf, CHUNK_START=i32, CHUNK_END=i32, DZ=f32, DK=f32, DKO=bf, DQ=f32,
                     DQO=bf)  # case a: two value heads per q/k head, summed here
            rows.append(("bwd_local_dk", 4,
                         *build(gdn_bwd_local_dk_kernel, t, dict(base, BK=bk, SUM_DQ=True), 4)))
        else:
            c = dict(base, BV=plan.block_v_local, NV=-(-a.V // plan.block_v_local))
            rows.append(("bwd_local", plan.num_warps_local,
                         *build(gdn_bwd_local_kernel, t, c, plan.num_warps_local)))
    print("plan over", over, "(--align)" if a.align else "")
    for what, warps, regs, spills, smem, counts in rows:
        print(f"{what:14s} warps={warps} regs={regs} stack={spills} smem={smem} "
              + " ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
