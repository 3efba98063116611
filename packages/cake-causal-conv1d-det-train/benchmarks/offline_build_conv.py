"""Build the conv kernels for sm_90 without a GPU and print what the builds say: registers,
stack (spills), shared memory and counts of SASS instruction groups (global loads / stores,
local memory), per kernel and plan variant.

    TRITON_INTERPRET=0 python benchmarks/offline_build_conv.py [--varlen] [--w 4] [--no-silu]

Compiles the forward (at 32-row sub-tiles and whole blocks) and the backward as
``api.py`` launches them for the benchmark's case
(bf16, SiLU, no bias, no initial / final state; fixed length, or ``--varlen`` packed) at the
CUDA rule's tiles and at a few candidates (``bwd_window = 1``, ``weight_tap_major = 1``,
``bwd_da_once = 1``: kernels/bwd_once.py; other tiles). Argument types
follow a launch at D = 4096 (pointers and D-multiples marked 16-divisible; the weight
stride W is not; ``T`` and ``n_blk_seq`` are not specialised, as in the kernels'
``do_not_specialize``). Static facts from Triton's own compiler and its bundled cuobjdump,
not timings. Needs ``TRITON_INTERPRET=0`` (else cake picks the interpreter).
"""

from __future__ import annotations

import argparse
import os

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("unset TRITON_INTERPRET: this builds real sm_90 code")

from cake_core.bench import offline_sm90_build as build  # noqa: E402


def main():
    from cake_causal_conv1d_det_train.kernels.bwd import causal_conv1d_bwd_kernel
    from cake_causal_conv1d_det_train.kernels.bwd_once import causal_conv1d_bwd_once_kernel
    from cake_causal_conv1d_det_train.kernels.fwd import causal_conv1d_fwd_kernel

    p = argparse.ArgumentParser()
    p.add_argument("--varlen", action="store_true")
    p.add_argument("--w", type=int, default=4)
    p.add_argument("--no-silu", action="store_true",
                   help="no activation (the da_once kernel, SiLU only, is left out)")
    a = p.parse_args()
    W, dt = a.w, "bf16"
    bw = 1 << (W - 1).bit_length()
    flags = dict(W=W, BW=bw, SILU=not a.no_silu, HAS_BIAS=False, HAS_H0=False, VARLEN=a.varlen,
                 RNE=False)
    table = "*i32" if a.varlen else f"*{dt}"
    cu = "*i64" if a.varlen else f"*{dt}"
    ints = ("T", "D", "n_blk_seq", "stride_xb", "stride_xt", "stride_w", "stride_wk", "s_hn",
            "s_hd", "s_hk", "stride_dyb", "stride_dyt", "s_tn", "s_td", "s_tk")
    # the weight's (channel, tap) strides: [D, W] as given (W, 1), or the [W, D] copy of
    # plan.weight_tap_major (1, D); a stride of 1 is specialised at launch, D is 16-divisible
    wlay = {0: (dict(stride_wk=1), ()), 1: (dict(stride_w=1), ("stride_wk",))}
    div16 = ("D", "stride_xb", "stride_xt", "stride_dyb", "stride_dyt")
    rows = []
    fwd_ptrs = {"X": dt, "WT": dt, "BIAS": dt, "H0": dt, "Y": dt, "FS": dt}
    # forward sub-tiles: 32 rows (the CUDA rule's fwd_sub_t_linear) and the whole block
    fwd_cfgs = [(bt, bd, warps, tm, st)
                for bt, bd, warps, tm in ((64, 64, 8, 0), (64, 64, 8, 1), (64, 32, 4, 0),
                                          (128, 64, 8, 0), (128, 64, 8, 1), (64, 128, 8, 0),
                                          (64, 128, 8, 1))
                for st in sorted({min(bt, 32), bt})]
    for bt, bd, warps, tm, st in fwd_cfgs:
        t = {**{k: f"*{v}" for k, v in fwd_ptrs.items()}, "TABLE": table, "CU": cu,
             **{n: "i32" for n in ints}}
        c = dict(flags, HAS_FS=False, BLOCK_T=bt, BLOCK_D=bd, SUB_T=st, **wlay[tm][0])
        ptrs = tuple(fwd_ptrs) + ("TABLE", "CU")
        rows.append((f"fwd {bt}x{bd} w{warps} tap_major={tm} sub_t={st}",
                     build(causal_conv1d_fwd_kernel, t, c,
                           ptrs + ("D", "stride_xb", "stride_xt") + wlay[tm][1], warps, 3)))
    bwd_ptrs = {"X": dt, "WT": dt, "BIAS": dt, "H0": dt, "DY": dt, "DHT": dt, "DX": dt,
                "DH0": dt, "DWP": "fp32", "DBP": "fp32"}
    for bt, bd, warps, win, tm in ((64, 32, 4, 0, 0), (64, 32, 4, 1, 0), (64, 32, 4, 0, 1),
                                   (64, 32, 4, 1, 1), (64, 64, 8, 0, 0), (64, 64, 8, 1, 1),
                                   (128, 32, 8, 0, 0), (128, 32, 8, 1, 1), (128, 64, 4, 0, 1),
                                   (128, 64, 8, 0, 1)):
        if win and W > 4:
            continue
        t = {**{k: f"*{v}" for k, v in bwd_ptrs.items()}, "TABLE": table, "CU": cu,
             **{n: "i32" for n in ints}}
        c = dict(flags, HAS_DHT=False, BLOCK_T=bt, BLOCK_D=bd, WINDOW=win, **wlay[tm][0])
        ptrs = tuple(bwd_ptrs) + ("TABLE", "CU")
        rows.append((f"bwd {bt}x{bd} w{warps} window={win} tap_major={tm}",
                     build(causal_conv1d_bwd_kernel, t, c, ptrs + div16 + wlay[tm][1], warps,
                           3)))
    # bwd_da_once = 1: the persistent kernel (no SILU / WINDOW constexprs: SiLU only), its
    # fp32 scratch SCR and the tile count n_tiles / channel blocks n_cb (not specialised)
    for bt, bd, warps, tm in ((64, 32, 4, 0), (64, 32, 4, 1), (128, 32, 8, 1), (64, 64, 8, 1),
                              (128, 64, 4, 1), (128, 64, 8, 1)) if not a.no_silu else ():
        t = {**{k: f"*{v}" for k, v in bwd_ptrs.items()}, "TABLE": table, "CU": cu,
             "SCR": "*fp32", **{n: "i32" for n in ints + ("n_cb", "n_tiles")}}
        c = {k: v for k, v in flags.items() if k != "SILU"}
        c.update(HAS_DHT=False, BLOCK_T=bt, BLOCK_D=bd, **wlay[tm][0])
        ptrs = tuple(bwd_ptrs) + ("TABLE", "CU", "SCR")
        rows.append((f"bwd {bt}x{bd} w{warps} da_once=1 tap_major={tm}",
                     build(causal_conv1d_bwd_once_kernel, t, c, ptrs + div16 + wlay[tm][1],
                           warps, 3)))
    act = "no activation" if a.no_silu else "SiLU"
    print(f"W = {W}, {'packed' if a.varlen else 'fixed length'}, bf16, {act}, no bias/state")
    print("| kernel | regs | stack | shared | LDG | STG | LDL/STL | SASS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (regs, stack, shared, _ptx, counts) in rows:
        print(f"| {name} | {regs} | {stack} | {shared} | {counts['LDG']} | {counts['STG']} | "
              f"{counts['LDL/STL']} | {counts['SASS']} |")


if __name__ == "__main__":
    main()
