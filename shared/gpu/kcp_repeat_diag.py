"""Diagnosis: which outputs of a KCP step (KDA or GDN) change between identical calls on
NCCL, and whether the local (one-GPU) entry repeats at the same shapes.

    torchrun --nproc-per-node 2 shared/gpu/kcp_repeat_diag.py kda [T] [exchange] [layout]
"""
import hashlib
import importlib.util
import sys

import torch
import torch.distributed as dist

fam = sys.argv[1] if len(sys.argv) > 1 else "kda"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
exchange = sys.argv[3] if len(sys.argv) > 3 else "allgather"
layout = sys.argv[4] if len(sys.argv) > 4 else "contiguous"
path = f"packages/cake-{fam}-det-train-kcp/benchmarks/bench_cake_{fam}_det_train_kcp.py"
spec = importlib.util.spec_from_file_location("bench", path)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

dist.init_process_group("nccl")
rank, W = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)


def h(t):
    if t is None:
        return "-"
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy()
                          .tobytes()).hexdigest()[:8]


local_mod = importlib.import_module(f"cake_{fam}_det_train")
kcp_mod = importlib.import_module(f"cake_{fam}_det_train_kcp")
cu = bench.make_cu(T, 8, "random", layout, W, 0)
part = kcp_mod.partition_det_kcp(torch.tensor(cu, dtype=torch.int64), W, layout)
ctx = kcp_mod.build_context_det_kcp(part, None, rank, dev, exchange=exchange)
idx = part.global_index(rank).to(dev)
if fam == "kda":
    glob, kw = bench.global_inputs(T, 16, 32, 128, torch.bfloat16, dev, 0, "none")
    fwd_k, bwd_k = kcp_mod.chunk_kda_det_fwd_kcp, kcp_mod.chunk_kda_det_bwd_kcp
    lf, lb = local_mod.chunk_kda_det_fwd, local_mod.chunk_kda_det_bwd
else:
    glob, kw = bench.global_inputs(T, 16, 32, 128, torch.bfloat16, dev, 0), {}
    fwd_k, bwd_k = kcp_mod.chunk_gdn_det_fwd_kcp, kcp_mod.chunk_gdn_det_bwd_kcp
    lf, lb = local_mod.chunk_gdn_det_fwd, local_mod.chunk_gdn_det_bwd
local = [t[:, idx].contiguous() for t in glob]
for it in range(3):
    o, saved = fwd_k(*local[:5], ctx, **kw)
    g = bwd_k(local[5], saved, ctx)
    torch.cuda.synchronize()
    names = getattr(g, "_fields", None) or [str(i) for i in range(len(g))]
    print(f"rank{rank} kcp it{it} o={h(o)} " + " ".join(f"{n}={h(x)}" for n, x in
                                                       zip(names, g, strict=True)), flush=True)
dist.barrier()
if rank == 0:
    cu_dev = torch.tensor(cu, dtype=torch.int64, device=dev)
    for it in range(3):
        o, _, s = lf(*glob[:5], cu_seqlens=cu_dev, **kw)
        g = lb(glob[5], None, s)
        torch.cuda.synchronize()
        print(f"local it{it} o={h(o)} " + " ".join(f"{n}={h(x)}" for n, x in
                                                  zip(g._fields, g, strict=True)), flush=True)
dist.barrier()
dist.destroy_process_group()
