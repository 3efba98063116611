"""out, lse and the gradients are bitwise repeatable under one plan, within a process and
across processes; a reordered dK sum is not (so the repeat tests can fail: the inputs are
sensitive to the order atomics would impose)."""

import dataclasses
from pathlib import Path

import torch
from _gqa_cases import DEV, GRADS, make, run
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_close_to_reference,
    assert_same_output_across_processes,
    bitwise_equal,
)
from cake_gqa_det_train import gqa_det, gqa_det_bwd, gqa_det_fwd, make_plan


def test_repeat_bitwise_three_runs_with_other_work_between():
    case = make(lens_q=[0, 1, 70, 33, 17], lens_k=[4, 1, 70, 40, 0], Hq=4, Hkv=2, D=64,
                dtype=torch.bfloat16, seed=31)

    def step():
        out = run(gqa_det, case, window_size=(40, 0), softcap=5.0)
        return [out[n] for n in GRADS]

    def noise():  # other launches (another head dim, dtype and layout) between repeats
        other = make(B=2, Sq=20, Sk=9, Hq=2, Hkv=2, D=128, seed=3)
        run(gqa_det, other, causal=False)

    first = assert_bitwise_repeat(step, repeats=3, between=noise)
    assert all(bool(torch.isfinite(t).all()) for n, t in zip(GRADS, first, strict=True)
               if n != "lse")


def test_repeat_bitwise_head_dim_256_bf16():
    """Qwen3-Next's attention (D 256, bf16, GQA 4:1) under the rule's own tiles for it; and
    the inputs can see a reordered dK sum through bf16 rounding: the long document's
    fp32 partials (4 heads x the rule's query blocks) summed in other orders change dK's
    bf16 bits in several of 20 orders. The long document spans three of the rule's query
    blocks (67 tokens on the interpreter's 32-row blocks, 259 on CUDA's 128), so its dK rows
    sum 12 partials."""
    block_m = make_plan(256, torch.bfloat16, DEV).dkdv_block_m
    case = make(lens_q=[1, 2 * block_m + 3], Hq=4, Hkv=1, D=256, dtype=torch.bfloat16, seed=32)
    first = assert_bitwise_repeat(lambda: [run(gqa_det, case)[n] for n in GRADS], repeats=2)
    got = dict(zip(GRADS, first, strict=True))
    scale = 256 ** -0.5
    q, k, v, do = (case[n][1:].float() for n in ("q", "k", "v", "do"))  # the long document
    parts = _dk_partials(q, k, v, do, got["out"][1:].float(), got["lse"][:, 1:].float(),
                         scale, block_m)
    ordered = torch.zeros_like(parts[0])
    for part in parts:  # the kernel's order: heads, then query blocks
        ordered = ordered + part
    want = (ordered * scale).bfloat16()
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        s = torch.zeros_like(parts[0])
        for i in torch.randperm(parts.shape[0], generator=gen).tolist():
            s = s + parts[i]  # sequential fp32 adds in arrival order
        differs += not bitwise_equal((s * scale).bfloat16(), want)
    assert differs >= 5, f"{differs} of 20 reorders changed bf16 bits: a weak repeat test"


def _dk_partials(q, k, v, do, out, lse, scale, block_m):
    """Per (query head of a KV head, query block of ``block_m`` rows), in the kernel's
    order (head, then block), the unscaled dK partial dS^T q in fp32 torch, from the
    forward's lse: ``[G * n_blocks, S, Hkv, D]`` for one causal document (q ``[S, Hq, D]``,
    k, v ``[S, Hkv, D]``, lse ``[Hq, S]``)."""
    S, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    ok = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    parts = []
    for g in range(G):
        per_kv = []
        for hk in range(Hkv):
            h = hk * G + g
            s = (q[:, h] @ k[:, hk].T) * scale
            p = torch.where(ok, torch.exp(s - lse[h][:, None]), torch.zeros_like(s))
            dp = do[:, h] @ v[:, hk].T
            delta = (do[:, h] * out[:, h]).sum(-1)
            ds = p * (dp - delta[:, None])
            per_kv.append([ds[m:m + block_m].T @ q[m:m + block_m, h]
                           for m in range(0, S, block_m)])
        for b in range(len(per_kv[0])):
            parts.append(torch.stack([per_kv[hk][b] for hk in range(Hkv)], 1))
    return torch.stack(parts)


def test_reordered_partial_sum_changes_bits():
    """dK of a GQA head group with several query blocks per key block: its per-(head,
    query block) fp32 partials summed in another order (what atomics would do) change the
    bits in at least one of 20 orders; the det path repeats its bits."""
    S, Hq, Hkv, D = 100, 4, 2, 64
    case = make(B=1, Sq=S, Hq=Hq, Hkv=Hkv, D=D, seed=32)
    plan = make_plan(D, torch.float32, DEV)
    q, k, v, do = (case[n][0] for n in ("q", "k", "v", "do"))
    out, lse, saved = gqa_det_fwd(q[None], k[None], v[None], plan=plan)
    _, dk, _ = gqa_det_bwd(do[None], saved)
    scale = D ** -0.5
    parts = _dk_partials(q, k, v, do, out[0], lse[0], scale, plan.dkdv_block_m)
    n_blocks = -(-S // plan.dkdv_block_m)
    assert n_blocks >= 2 and parts.shape == (Hq // Hkv * n_blocks, S, Hkv, D)
    ordered = torch.zeros_like(parts[0])
    for part in parts:  # the kernel's order: heads, then query blocks
        ordered = ordered + part
    ordered = ordered * scale
    # the partials are dK's: their in-order sum is the det dK up to the dots' rounding
    # (fp32 dots under the interpreter, TF32 on CUDA)
    assert_close_to_reference(dk[0], ordered.double(), torch.float32, "dk",
                              tol=1e-5 if DEV.type == "cpu" else 5e-3)
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        s = torch.zeros_like(parts[0])
        for i in torch.randperm(parts.shape[0], generator=gen).tolist():
            s = s + parts[i]  # sequential fp32 adds in arrival order
        differs += not bitwise_equal(s * scale, ordered)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    # the det path, again (low level and autograd): the same bits
    _, _, saved2 = gqa_det_fwd(q[None], k[None], v[None], plan=plan)
    assert bitwise_equal(gqa_det_bwd(do[None], saved2)[1], dk)
    assert bitwise_equal(run(gqa_det, case, plan=plan)["dk"], dk)


def test_bits_promised_per_plan():
    """Another dkdv_block_m regroups dK's and dV's sums (other bits); out, lse and dQ do not
    depend on it (their kernels and block sizes are unchanged)."""
    case = make(B=1, Sq=100, Hq=4, Hkv=2, D=64, seed=33)
    plan = make_plan(64, torch.float32, DEV)
    a = run(gqa_det, case, plan=plan)
    other = 16 if plan.dkdv_block_m != 16 else 32
    b = run(gqa_det, case, plan=dataclasses.replace(plan, dkdv_block_m=other))
    for n in ("out", "lse", "dq"):
        assert bitwise_equal(a[n], b[n]), n
    if DEV.type == "cpu":  # on CUDA the MMA steps over K in 8s either way: bits may agree
        assert not (bitwise_equal(a["dk"], b["dk"]) and bitwise_equal(a["dv"], b["dv"]))
    tol = 1e-5 if DEV.type == "cpu" else 2e-3  # TF32 dots on CUDA
    torch.testing.assert_close(a["dk"], b["dk"], rtol=10 * tol, atol=tol)


_HASH_SCRIPT = """
import hashlib, sys, torch
sys.path.insert(0, %r)
from _gqa_cases import make, run
from cake_core.testing import bits
from cake_gqa_det_train import gqa_det
case = make(lens_q=[0, 3, 45, 20], lens_k=[2, 3, 45, 8], Hq=4, Hkv=1, D=64,
            dtype=torch.bfloat16, seed=7)
out = run(gqa_det, case, window_size=(17, 0), softcap=3.0)
d = hashlib.sha256()
for n in ("out", "lse", "dq", "dk", "dv"):
    d.update(bits(out[n]).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT % str(Path(__file__).parent))
