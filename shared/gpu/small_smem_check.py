"""The plans the CUDA rules give GPUs with less shared memory than Hopper (A100's 163 KiB,
consumer GPUs' 99 KiB), run on this GPU: GQA (D 64 / 128 / 256), GDN and KDA (K = V = 128),
bf16, packed ragged documents, forward + backward. Each output and gradient is compared with
the same call under this GPU's own rule (Hopper's plans): relative Frobenius difference, and
whether the bits are equal (GDN / KDA change only pipeline stages).

    python shared/gpu/small_smem_check.py       (a CUDA machine; PYTHONPATH as the guide says)
"""
from __future__ import annotations

import torch

DEV = "cuda"
CLASSES = (166912, 101376)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def gqa_case(D, plan):
    from cake_gqa_det_train import gqa_det

    g = torch.Generator(device=DEV).manual_seed(D)
    cu = torch.tensor([0, 1, 300, 300, 1100, 2048], dtype=torch.int32, device=DEV)
    T = int(cu[-1])
    q = torch.randn(T, 8, D, device=DEV, generator=g).bfloat16().requires_grad_()
    k = torch.randn(T, 2, D, device=DEV, generator=g).bfloat16().requires_grad_()
    v = torch.randn(T, 2, D, device=DEV, generator=g).bfloat16().requires_grad_()
    do = torch.randn(T, 8, D, device=DEV, generator=g).bfloat16()
    out = gqa_det(q, k, v, cu, cu, plan=plan)
    out.backward(do)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def lin_case(fam, plan):
    g = torch.Generator(device=DEV).manual_seed(3)
    T, H, K = 2048, 4, 128
    cu = torch.tensor([0, 1, 300, 1100, T], dtype=torch.int32, device=DEV)
    q, k, v = (torch.randn(1, T, H, K, device=DEV, generator=g).bfloat16().requires_grad_()
               for _ in "qkv")
    beta = torch.rand(1, T, H, device=DEV, generator=g).bfloat16().requires_grad_()
    if fam == "gdn":
        from cake_gdn_det_train import chunk_gated_delta_rule_det as entry

        gate = (-torch.rand(1, T, H, device=DEV, generator=g) * 0.1).requires_grad_()
    else:
        from cake_kda_det_train import chunk_kda_det as entry

        gate = (-torch.rand(1, T, H, K, device=DEV, generator=g) * 0.1).requires_grad_()
    o, _ = entry(q, k, v, gate, beta, cu_seqlens=cu, plan=plan, use_qk_l2norm_in_kernel=True)
    o.float().square().sum().backward()
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "dg": gate.grad,
            "db": beta.grad}


def main():
    import cake_core.linear_attention as la
    import cake_gqa_det_train.plan as gp
    from cake_gdn_det_train import make_plan as gdn_plan
    from cake_gqa_det_train import make_plan as gqa_plan
    from cake_kda_det_train import make_plan as kda_plan

    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    real_gp, real_la = gp.shared_memory, la.rule_shared_memory
    base = {("gqa", D): gqa_case(D, gqa_plan(D, torch.bfloat16, DEV)) for D in (64, 128, 256)}
    base["gdn"] = lin_case("gdn", gdn_plan(128, 128, torch.bfloat16, DEV))
    base["kda"] = lin_case("kda", kda_plan(128, 128, torch.bfloat16, DEV))
    for smem in CLASSES:
        gp.shared_memory = la.rule_shared_memory = lambda d, s=smem: s
        try:
            for key, ref in base.items():
                if isinstance(key, tuple):
                    plan = gqa_plan(key[1], torch.bfloat16, DEV)
                    got = gqa_case(key[1], plan)
                else:
                    plan = (gdn_plan if key == "gdn" else kda_plan)(128, 128, torch.bfloat16, DEV)
                    got = lin_case(key, plan)
                diffs = {n: rel(got[n], ref[n]) for n in ref}
                same = all(torch.equal(got[n], ref[n]) for n in ref)
                print(f"smem {smem} {key}: max rel diff {max(diffs.values()):.2e} "
                      f"({', '.join(f'{n} {d:.1e}' for n, d in diffs.items())}); bits equal "
                      f"{same}", flush=True)
        finally:
            gp.shared_memory, la.rule_shared_memory = real_gp, real_la


if __name__ == "__main__":
    main()
