"""A/B on the GPU: cake-gqa-det-train's two-pass det backward against the one-pass one of
``gqa_onepass_bwd.patch`` (``bwd_onepass = 1``, FlashAttention-3's ordered dQ) at several
dK/dV tiles, beside SDPA cuDNN, at Qwen3-Next's attention shape (D 256) and a D 128 shape.
Run with the patched package first on PYTHONPATH (README.md here)."""

import dataclasses
import hashlib
import time

import cake_gqa_det_train as g
import torch
import torch.nn.functional as F
from cake_gqa_det_train import gqa_det, make_plan
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

DEV = "cuda"


def case(B, S, Hq, Hkv, D, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def mk(*s):
        return torch.randn(*s, device=DEV, generator=gen, dtype=torch.bfloat16)

    q, k, v, do = mk(B * S, Hq, D), mk(B * S, Hkv, D), mk(B * S, Hkv, D), mk(B * S, Hq, D)
    cu = torch.arange(0, B + 1, device=DEV, dtype=torch.int32) * S
    return q, k, v, do, cu


def digest(ts):
    m = hashlib.sha256()
    for t in ts:
        m.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return m.hexdigest()[:12]


def run_shape(B, S, Hq, Hkv, D):
    q, k, v, do, cu = case(B, S, Hq, Hkv, D)
    base = make_plan(D, torch.bfloat16, DEV)
    variants = [("two-pass (rule)", {})]
    for bn in (64, 32):
        for w in (8, 4):
            variants.append((f"one-pass {base.dkdv_block_m}x{bn} w{w}",
                             dict(bwd_onepass=1, dkdv_block_n=bn, dkdv_warps=w)))
    ref = None
    for name, change in variants:
        try:
            plan = dataclasses.replace(base, **change)

            def fb(plan=plan):
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                o = gqa_det(qq, kk, vv, cu, cu, max_seqlen_q=S, max_seqlen_k=S, plan=plan)
                o.backward(do)
                return qq.grad, kk.grad, vv.grad

            t0 = time.time()
            grads = fb()
            torch.cuda.synchronize()
            first = time.time() - t0
            same = digest(grads) == digest(fb())
            ref = grads if ref is None else ref
            err = max(float((a.float() - b.float()).norm() / b.float().norm())
                      for a, b in zip(grads, ref, strict=True))
            ms = do_bench(fb, warmup=5, rep=200, return_mode="median")
            print(f"D{D} {name}: fwd+bwd {ms:.3f} ms, first call {first:.1f} s, "
                  f"repeats {same}, rel. diff to two-pass {err:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"D{D} {name}: ERROR {repr(e)[:300]}", flush=True)
    qs, ks, vs, dos = (t.view(B, S, -1, D).transpose(1, 2) for t in (q, k, v, do))

    def sdpa():
        qq, kk, vv = (t.detach().requires_grad_() for t in (qs, ks, vs))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
        o.backward(dos)

    try:
        print(f"D{D} SDPA cuDNN: fwd+bwd "
              f"{do_bench(sdpa, warmup=5, rep=200, return_mode='median'):.3f} ms", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"D{D} SDPA cuDNN: ERROR {repr(e)[:200]}", flush=True)


if __name__ == "__main__":
    print("package", g.__file__, flush=True)
    for shape in [(4, 4096, 16, 2, 256), (4, 4096, 32, 8, 128)]:
        run_shape(*shape)
