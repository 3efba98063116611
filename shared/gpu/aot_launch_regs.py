"""Registers and spills of every Triton kernel one GDN or KDA forward+backward launches under
the CUDA rule's plan, compiled for sm_90 on any machine (no GPU needed).

    python shared/gpu/aot_launch_regs.py gdn|kda|gqa [--K 128] [--V 128] [--plan FIELD=INT ...]

(gqa: ``--K`` is the head dim; one packed causal call with 8 query heads per KV head.
dense: the dense projection at (M, N, K) = (4096, 128, 8192); lmhead: the LM-head loss with
the plan of H 4096, V 32000 on 64 tokens, its cuBLAS GEMMs off (so cake's logits and dhidden
kernels are listed too; CUDA runs cuBLAS there; lmhead takes --plan, dense does not.)

Two steps, each in its own process: (1) under Triton's interpreter, one small packed bf16
call of the family's autograd entry with ``make_plan(K, V, bf16, "cuda")`` records each
kernel's arguments and launch options (the plan's tiles, warps, stages), the host's dtype
choices made as on CUDA (bf16 dots and stores, not the interpreter's fp32); (2) with
``TRITON_INTERPRET=0``, each kernel is compiled for sm_90 from those argument types and
constexprs, with the runtime's specialization of each argument as Triton computes it
(16-byte aligned pointers and 16-divisible ints marked divisible, ints equal to 1 made
constexprs: the CPU tensors' alignment stands for the GPU's), and the bundled ptxas reports
registers per thread and spill bytes (and the PTX's count of wgmma and legacy mma.sync
instructions, and Triton's shared memory). Not a timing; a map of where register pressure
sits.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import inspect
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RECORD = "/tmp/cake_aot_launches.json"
#: Opt-in shared memory per block (bytes) of the GPUs --arch names (others: 99 KiB)
SMEM_BY_ARCH = {80: 166912, 87: 166912, 90: 232448, 100: 232448}


def _paths():
    sys.path[:0] = sorted(glob.glob(os.path.join(ROOT, "packages", "*", "src")))


def _encode(v, constexpr: bool):
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
             torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8",
             torch.bool: "i1"}
    if type(v).__name__ == "TensorDescriptor":  # a host TMA descriptor, as Triton types it
        shape = ", ".join(str(b) for b in v.block_shape)
        return {"type": f"tensordesc<{names[v.base.dtype]}[{shape}]>"}
    if constexpr or v is None:
        if hasattr(v, "name") and type(v).__module__.startswith("triton"):
            return {"type": "constexpr", "tl": v.name}
        return {"type": "constexpr", "value": v}
    if isinstance(v, (bool, int, float)) or isinstance(v, torch.Tensor):
        # Triton's own runtime specialization of the argument (as JITFunction.run's binder
        # computes it on the GPU): 16-divisible ints and 16-byte aligned pointers get the
        # divisibility attribute, an int equal to 1 becomes a constexpr
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.nvidia.compiler import CUDABackend

        ty, attr = native_specialize_impl(CUDABackend, v, False, True, True)
        if ty == "constexpr":
            return {"type": "constexpr", "value": attr}
        return {"type": ty, "attr": attr or ""}
    raise TypeError(f"argument of type {type(v).__name__}")


def record(fam: str, K: int, V: int, over: dict) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    _paths()
    import cake_core.triton_utils  # noqa: F401
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict = {}
    real = InterpretedFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        # one record per kernel and distinct signature, constexprs and options (a kernel
        # launched with two tilings, e.g. cake_core's matmul, is listed twice)
        fn = self.fn
        params = list(inspect.signature(fn).parameters.values())
        opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "maxnreg")
                if k in kwargs}
        bound = dict(zip([p.name for p in params], args, strict=False)) | kwargs
        sig = {p.name: _encode(bound.get(p.name, p.default),
                               "constexpr" in str(p.annotation)) for p in params}
        rec = {"signature": sig, "options": opts}
        base = f"{fn.__module__}:{fn.__name__}"
        same = [k for k in seen if k.split("#")[0] == base]
        if all(seen[k] != rec for k in same):
            seen[f"{base}#{len(same)}" if same else base] = rec
        kwargs.update(opts)
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = spy
    if fam in ("dense", "lmhead"):
        import cake_core.gemm
        import torch

        cake_core.gemm.is_interpreting = lambda: False  # the host's CUDA dtype choices
        g = torch.Generator().manual_seed(0)
        if fam == "dense":  # issue 45's skinny case: (M, N, K) = (4096, 128, 8192)
            import cake_dense_projection_det_gemm.plan as dp
            from cake_dense_projection_det_gemm import dense_projection_det

            M, N, Kd = 4096, 128, 8192
            x = (torch.randn(M, Kd, generator=g) * 0.1).bfloat16().requires_grad_()
            w = (torch.randn(N, Kd, generator=g) * 0.1).bfloat16().requires_grad_()
            # the rule as on an H100 / H200 (132 SMs, sm_90, TMA): it reads the device
            dp.sm_count, dp.tma_available = (lambda d: 132), (lambda: True)
            arch = int(os.environ.get("CAKE_AOT_ARCH", "90"))
            dp.cuda_capability = lambda d: (arch // 10, arch % 10)
            plan = dp._rule(M, N, Kd, torch.bfloat16, torch.device("cuda"))
            dense_projection_det(x, w, plan=plan).float().sum().backward()
        else:  # the LM head's plan at H 4096, V 32000 (a rule of H, V), a few tokens
            from cake_lm_head_loss_det_train import lm_head_loss_det, make_plan

            H, Vv, T = 4096, 32000, 64
            h = (torch.randn(T, H, generator=g) * 0.1).bfloat16().requires_grad_()
            w = (torch.randn(Vv, H, generator=g) * 0.02).bfloat16().requires_grad_()
            y = torch.randint(0, Vv, (T,), generator=g)
            # the CUDA rule's plan with its cuBLAS GEMMs off (they need CUDA tensors): the
            # logits and dhidden GEMMs then launch cake's kernels, which CUDA does not run
            import dataclasses

            import cake_lm_head_loss_det_train.plan as lp

            arch = int(os.environ.get("CAKE_AOT_ARCH", "90"))
            lp.cuda_capability = lambda d: (arch // 10, arch % 10)
            plan = dataclasses.replace(make_plan(H, Vv, torch.bfloat16, "cuda"), cublas_gemms=0,
                                       **over)
            lm_head_loss_det(h, w, y, plan=plan).backward()
        with open(RECORD, "w") as f:
            json.dump(seen, f)
        return
    mod = __import__(f"cake_{fam}_det_train", fromlist=["make_plan"])
    if fam == "gqa":  # K: the head dim; GROUP 8, causal, packed documents
        import dataclasses

        import cake_gqa_det_train.plan as gp
        import torch

        # the rule as on a GPU of --arch: its shared memory per block (opt-in)
        arch = int(os.environ.get("CAKE_AOT_ARCH", "90"))
        gp.shared_memory = lambda d: SMEM_BY_ARCH.get(arch, 101376)
        dt = torch.float32 if os.environ.get("CAKE_AOT_DTYPE") == "fp32" else torch.bfloat16
        plan = dataclasses.replace(mod.make_plan(K, dt, "cuda"), **over)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(130, 8, K, generator=g).to(dt).requires_grad_()
        k, v = (torch.randn(130, 1, K, generator=g).to(dt).requires_grad_() for _ in "kv")
        cu = torch.tensor([0, 1, 70, 130], dtype=torch.int32)
        mod.gqa_det(q, k, v, cu, cu, plan=plan).float().sum().backward()
        with open(RECORD, "w") as f:
            json.dump(seen, f)
        return
    # the host's dtype choices as on CUDA (the interpreter's own: fp32 dots and stores for
    # bf16); the values computed here are not used, only the launches
    import cake_core.gemm

    host = [cake_core.gemm, importlib.import_module(
        "cake_gdn_det_train.api" if fam == "gdn" else "cake_kda_det_train.chunk")]
    for m in host:
        m.is_interpreting = lambda: False
    import cake_core.linear_attention as la

    # the rule as on a GPU of --arch: its shared memory per block (opt-in)
    arch = int(os.environ.get("CAKE_AOT_ARCH", "90"))
    la.rule_shared_memory = lambda d: SMEM_BY_ARCH.get(arch, 101376)
    entry = mod.chunk_gated_delta_rule_det if fam == "gdn" else mod.chunk_kda_det
    import dataclasses

    plan = dataclasses.replace(mod.make_plan(K, V, torch.bfloat16, "cuda"), **over)
    g = torch.Generator().manual_seed(0)
    T, H = 130, 2
    q, k = (torch.randn(1, T, H, K, generator=g).bfloat16().requires_grad_() for _ in "qk")
    v = torch.randn(1, T, H, V, generator=g).bfloat16().requires_grad_()
    gate = (-torch.rand(1, T, H, *(() if fam == "gdn" else (K,)), generator=g)).float()
    beta = torch.rand(1, T, H, generator=g).bfloat16()
    cu = torch.tensor([0, 1, 70, T], dtype=torch.int32)
    o, _ = entry(q, k, v, gate.requires_grad_(), beta.requires_grad_(), cu_seqlens=cu,
                 plan=plan, use_qk_l2norm_in_kernel=True)
    o.float().sum().backward()
    with open(RECORD, "w") as f:
        json.dump(seen, f)


def compile_all(arch: int = 90) -> None:
    os.environ["TRITON_INTERPRET"] = "0"
    _paths()
    import triton
    import triton.language as tl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with open(RECORD) as f:
        seen = json.load(f)
    for key, r in seen.items():
        mod, name = key.split("#")[0].split(":")
        fn = getattr(importlib.import_module(mod), name)
        sig, consts, attrs = {}, {}, {}
        for i, (p, e) in enumerate(r["signature"].items()):
            sig[p] = e["type"]
            if e["type"] == "constexpr":
                consts[p] = tl.dtype(e["tl"]) if "tl" in e else e.get("value")
            if e.get("attr"):
                attrs[(i,)] = BaseBackend.parse_attr(e["attr"])
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", arch, 32), options=r["options"])
            with open("/tmp/cake_aot.ptx", "w") as f:
                f.write(k.asm["ptx"])
            out = subprocess.run([ptxas, f"-arch=sm_{arch}{'a' if arch == 90 else ''}", "-v", "/tmp/cake_aot.ptx", "-o",
                                  "/tmp/cake_aot.cubin"], capture_output=True, text=True,
                                 check=False).stderr
            rep = "; ".join(line.split(":", 1)[-1].strip() for line in out.splitlines()
                            if "registers" in line or "spill" in line)
            # tensor-core instructions: Hopper's warpgroup MMA, or the legacy per-warp MMA
            # (a product whose M is under a warpgroup's 64 rows, or not wgmma-eligible)
            rep += (f"; wgmma {k.asm['ptx'].count('wgmma.mma_async')}, mma.sync "
                    f"{k.asm['ptx'].count('mma.sync.aligned')}; shared {k.metadata.shared} B")
        except Exception as e:  # noqa: BLE001 - reported, the others still compile
            rep = f"not compiled: {type(e).__name__}: {str(e)[:160]}"
        twice = sum(k.split("#")[0] == key.split("#")[0] for k in seen) > 1
        tiles = {p: v for p, v in consts.items() if isinstance(v, int)} if twice else ""
        print(f"{name} {tiles}{r['options']}: {rep}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("family", nargs="?", choices=("gdn", "kda", "gqa", "dense", "lmhead"))
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--plan", nargs="*", default=[], help="plan overrides FIELD=INT (a sweep's "
                   "candidates; the plan's own checks apply)")
    p.add_argument("--arch", type=int, default=90, help="compute capability to compile for, "
                   "as 80, 86, 89, 90, 100, 120 (default 90); the rule's plan stays the one "
                   "recorded (dense / lmhead: the capability the rule reads is this one)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="gqa only: the inputs' dtype (default bf16)")
    p.add_argument("--step", choices=("record", "compile"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.step == "record":
        return record(a.family, a.K, a.V, {k: int(v) for k, v in
                                           (x.split("=") for x in a.plan)})
    if a.step == "compile":
        return compile_all(a.arch)
    os.environ["CAKE_AOT_ARCH"] = str(a.arch)
    os.environ["CAKE_AOT_DTYPE"] = a.dtype
    for step in ("record", "compile"):
        subprocess.run([sys.executable, __file__, a.family or "gdn", "--K", str(a.K), "--V",
                        str(a.V), "--arch", str(a.arch), "--step", step, "--plan", *a.plan],
                       check=True)


if __name__ == "__main__":
    main()
