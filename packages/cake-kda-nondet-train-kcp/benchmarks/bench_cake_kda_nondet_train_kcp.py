"""Benchmark cake-kda-nondet-train-kcp against cake-kda-det-train-kcp: the ratio issue 44
asks for, nondet / det, over the same documents, ranks and exchange.

    torchrun --nproc-per-node 2 benchmarks/bench_cake_kda_nondet_train_kcp.py \\
        --seqlen 65536 --docs 8 --boundary random --layout zigzag [--check] [--out r.json]
    python benchmarks/bench_cake_kda_nondet_train_kcp.py --world-size 2 --device cpu \\
        --seqlen 300 --docs 3 --heads 1 --v-heads 1 --head-dim 16 --dtype fp32 --reps 1

Arguments, launch, documents and the per-rank record are cake-kda-det-train-kcp's benchmark
(``packages/cake-kda-det-train-kcp/benchmarks/bench_cake_kda_det_train_kcp.py``, loaded
from this repository), run through the nondet entries; each rank then times the det KCP
entries on the same inputs (``det_kcp``). Rank 0's record adds
``det_kcp_fwd_bwd_ms_slowest_rank`` and ``ratio_nondet_over_det`` (below 1: nondet faster;
today the two run the same kernels and route, so about 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from cake_core import kcp_bench

_DET = (Path(__file__).resolve().parents[2] / "cake-kda-det-train-kcp" / "benchmarks"
        / "bench_cake_kda_det_train_kcp.py")
_spec = importlib.util.spec_from_file_location("bench_cake_kda_det_train_kcp", _DET)
DET = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(DET)

#: the nondet KCP entries, by name (the det benchmark's API)
API = dict(module="cake_kda_nondet_train_kcp", fwd="chunk_kda_nondet_fwd_kcp",
           bwd="chunk_kda_nondet_bwd_kcp", build="build_context_nondet_kcp",
           partition="partition_nondet_kcp", comm="comm_bytes_nondet")


def run_rank(rank, W, a, device):
    rec = DET.run_rank(rank, W, a, device, api=API)
    det = DET.run_rank(rank, W, argparse.Namespace(**{**vars(a), "base": "none",
                                                      "check": False}), device)
    rec["det_kcp"] = {k: det[k] for k in ("fwd", "bwd", "fwd_bwd")}
    return rec


def summary(a, W, device, recs) -> dict:
    out = DET.summary(a, W, device, recs)
    det_ms = max(r["det_kcp"]["fwd_bwd"]["ms"] for r in recs)
    out["det_kcp_fwd_bwd_ms_slowest_rank"] = det_ms
    out["ratio_nondet_over_det"] = out["kcp_fwd_bwd_ms_slowest_rank"] / det_ms if det_ms else None
    return out


def main(argv=None) -> int:
    return kcp_bench.main(DET.parse_args(argv), run_rank, summary)


if __name__ == "__main__":
    sys.exit(main())
