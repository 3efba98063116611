"""Host time per call of each det family's entry beside the equivalent torch call, at shapes
so small that the GPU's work is negligible (issue 45: a cake call's host overhead at most
torch's). Forward, and forward + backward, each issued 200 times without waiting.

    python shared/gpu/host_overhead.py            # CUDA: the real launches
    python shared/gpu/host_overhead.py --profile rmsnorm,dense_projection
        # cProfile of 200 forward and 100 forward + backward calls of the named families:
        # where their host time goes (functions by own time)
    TRITON_INTERPRET=1 python shared/gpu/host_overhead.py --stub
        # a CPU: every Triton launch stubbed out (no kernel runs), so cake's column is its
        # Python alone and torch's is torch's CPU op; the launches' own host cost is not in it

Prints one row per family: cake us, torch us, cake / torch (fwd, then fwd+bwd). The torch
equivalents: F.rms_norm; F.rms_norm(o) * silu(gate); a depthwise F.conv1d with silu;
F.linear; torch._grouped_mm; F.linear + F.cross_entropy; scaled_dot_product_attention (GQA);
FLA's chunk_gated_delta_rule / chunk_kda where ``import fla`` works (else cake alone).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

STUB = "--stub" in sys.argv
if STUB:
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if STUB:
    from triton.runtime import interpreter

    interpreter.InterpretedFunction.run = lambda self, *a, **k: None

DEV = "cuda" if torch.cuda.is_available() and not STUB else "cpu"
DT = torch.bfloat16


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def host_us(f, n=200, rounds=3):
    for _ in range(3):
        f()
    sync()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out.append((time.perf_counter() - t) / n * 1e6)
        sync()
    return statistics.median(out)


def leaf(*shape, dtype=DT, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype).requires_grad_()


def fwd_bwd(fn):
    """(fwd-only callable, fwd+bwd callable) for ``fn() -> tensor or tuple``."""
    def fb():
        out = fn()
        o = out[0] if isinstance(out, tuple) else out
        o.float().sum().backward()
    return fn, fb


def cases():
    T, D = 256, 256
    from cake_rmsnorm_det_train import rmsnorm_det
    x, w = leaf(T, D), leaf(D)
    yield "rmsnorm", fwd_bwd(lambda: rmsnorm_det(x, w, 1e-6)), \
        fwd_bwd(lambda: F.rms_norm(x, (D,), w, 1e-6))

    from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det
    o, g, wn = leaf(T, 128), leaf(T, 128), leaf(128)
    yield "rmsnorm_silu_gate", fwd_bwd(lambda: rmsnorm_silu_gate_det(o, g, wn, 1e-6)), \
        fwd_bwd(lambda: F.rms_norm(o, (128,), wn, 1e-6) * F.silu(g))

    from cake_causal_conv1d_det_train import causal_conv1d_det
    xc, wc = leaf(1, T, D), leaf(D, 4)
    yield "causal_conv1d", fwd_bwd(lambda: causal_conv1d_det(xc, wc, activation="silu")), \
        fwd_bwd(lambda: F.silu(F.conv1d(xc.transpose(1, 2), wc[:, None], padding=3,
                                        groups=D)[..., :T]))

    from cake_dense_projection_det_gemm import dense_projection_det
    wl = leaf(D, D)
    yield "dense_projection", fwd_bwd(lambda: dense_projection_det(x, wl)), \
        fwd_bwd(lambda: F.linear(x, wl))

    from cake_moe_grouped_det_gemm import moe_grouped_det_gemm
    E = 8
    we = leaf(E, D, D, scale=D ** -0.5)
    offs = torch.arange(1, E + 1, device=DEV, dtype=torch.int32) * (T // E)
    gmm = getattr(torch, "_grouped_mm", None)
    ref = (lambda: gmm(x, we.transpose(-2, -1), offs=offs)) if gmm is not None and \
        DEV == "cuda" else None
    yield "moe_grouped_gemm", fwd_bwd(lambda: moe_grouped_det_gemm(x, we, offs)), \
        fwd_bwd(ref) if ref else None

    from cake_lm_head_loss_det_train import lm_head_loss_det
    V = 1024
    wv = leaf(V, D, scale=D ** -0.5)
    y = torch.randint(0, V, (T,), device=DEV)
    yield "lm_head_loss", fwd_bwd(lambda: lm_head_loss_det(x, wv, y)), \
        fwd_bwd(lambda: F.cross_entropy(F.linear(x, wv).float(), y))

    from cake_gqa_det_train import gqa_det
    q, k, v = leaf(2, 128, 8, 64), leaf(2, 128, 2, 64), leaf(2, 128, 2, 64)
    yield "gqa", fwd_bwd(lambda: gqa_det(q, k, v)), \
        fwd_bwd(lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=True))

    try:
        import fla.ops.gated_delta_rule as fla_gdn
        import fla.ops.kda as fla_kda
    except ImportError:
        fla_gdn = fla_kda = None
    from cake_gdn_det_train import chunk_gated_delta_rule_det
    from cake_kda_det_train import chunk_kda_det
    H, K = 2, 128
    qg, kg, vg = leaf(1, 128, H, K), leaf(1, 128, H, K), leaf(1, 128, H, K)
    gg = (-torch.rand(1, 128, H, device=DEV)).requires_grad_()
    gk = (-torch.rand(1, 128, H, K, device=DEV)).requires_grad_()
    beta = torch.rand(1, 128, H, device=DEV, dtype=DT).requires_grad_()
    yield "gdn", fwd_bwd(lambda: chunk_gated_delta_rule_det(
        qg, kg, vg, gg, beta, use_qk_l2norm_in_kernel=True)), \
        fwd_bwd(lambda: fla_gdn.chunk_gated_delta_rule(
            qg, kg, vg, gg, beta, use_qk_l2norm_in_kernel=True)) if fla_gdn else None
    yield "kda", fwd_bwd(lambda: chunk_kda_det(
        qg, kg, vg, gk, beta, use_qk_l2norm_in_kernel=True)), \
        fwd_bwd(lambda: fla_kda.chunk_kda(
            qg, kg, vg, gk, beta, use_qk_l2norm_in_kernel=True)) if fla_kda else None


def profile(names):
    import cProfile
    import io
    import pstats

    for name, cake, _ in cases():
        if name not in names:
            continue
        for label, f, n in (("fwd", cake[0], 200), ("fwd+bwd", cake[1], 100)):
            for _ in range(3):
                f()
            sync()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(n):
                f()
            pr.disable()
            sync()
            buf = io.StringIO()
            pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(22)
            body = buf.getvalue()
            print(f"== {name} {label}: {n} calls, functions by own time\n" +
                  body[body.find("ncalls"):].rstrip()[:4000], flush=True)


def main():
    if "--profile" in sys.argv:
        return profile(sys.argv[sys.argv.index("--profile") + 1].split(","))
    print(f"host us per call ({'CPU, launches stubbed' if STUB else DEV}), torch "
          f"{torch.__version__}; ratio = cake / torch")
    print(f"{'family':18s} {'fwd cake':>9s} {'torch':>8s} {'ratio':>6s}   "
          f"{'f+b cake':>9s} {'torch':>8s} {'ratio':>6s}")
    for name, cake, ref in cases():
        try:
            c = [host_us(f) for f in cake]
            r = [host_us(f) for f in ref] if ref else [float("nan")] * 2
        except Exception as e:  # one family's failure does not hide the others
            print(f"{name:18s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        print(f"{name:18s} {c[0]:9.1f} {r[0]:8.1f} {c[0] / r[0]:6.2f}   "
              f"{c[1]:9.1f} {r[1]:8.1f} {c[1] / r[1]:6.2f}", flush=True)


if __name__ == "__main__":
    main()
