"""Benchmark cake-gdn-nondet-train-kcp against cake-gdn-det-train-kcp: the ratio issue 44
asks for, nondet / det, over the same documents, ranks and exchange.

    torchrun --nproc-per-node 2 benchmarks/bench_cake_gdn_nondet_train_kcp.py \\
        --seqlen 65536 --docs 8 --boundary random --layout zigzag [--check] [--out r.json]
    python benchmarks/bench_cake_gdn_nondet_train_kcp.py --world-size 2 --device cpu \\
        --seqlen 300 --docs 3 --heads 1 --v-heads 1 --head-dim 16 --dtype fp32 --reps 1

Arguments, launch, documents and the per-rank record are cake-gdn-det-train-kcp's benchmark
(``packages/cake-gdn-det-train-kcp/benchmarks/bench_cake_gdn_det_train_kcp.py``, loaded
from this repository), run through the nondet entries; each rank then times the det KCP
entries on the same inputs (``det_kcp``). Rank 0's record adds
``det_kcp_fwd_bwd_ms_slowest_rank`` and ``ratio_nondet_over_det`` (below 1: nondet faster;
today the two run the same kernels and route, so about 1).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from cake_core import kcp_bench

_DET = str(Path(__file__).resolve().parents[2] / "cake-gdn-det-train-kcp" / "benchmarks"
           / "bench_cake_gdn_det_train_kcp.py")

#: the nondet KCP entries, by name (the det benchmark's API)
API = dict(module="cake_gdn_nondet_train_kcp", fwd="chunk_gdn_nondet_fwd_kcp",
           bwd="chunk_gdn_nondet_bwd_kcp", build="build_context_nondet_kcp",
           partition="partition_nondet_kcp", comm="comm_bytes_nondet")


def main(argv=None) -> int:
    return kcp_bench.main(kcp_bench.load_bench(_DET).parse_args(argv),
                          functools.partial(kcp_bench.nondet_run_rank, _DET, API),
                          functools.partial(kcp_bench.nondet_summary, _DET))


if __name__ == "__main__":
    sys.exit(main())
