"""Build manifest of cake-lm-head-loss-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-lm-head-loss-det-train",
    "import_name": "cake_lm_head_loss_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["lm_head_loss_det", "lm_head_loss_det_fwd", "lm_head_loss_det_bwd",
                     "LMHeadLoss"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_lm_head_loss_det_train.kernels.ce", "function": "ce_chunk_kernel"},
        {"module": "cake_lm_head_loss_det_train.kernels.reduce", "function": "loss_sum_kernel"},
        # the chunk GEMMs and the ordered dbias sum (shared)
        {"module": "cake_core.gemm", "function": "matmul_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["LMHeadLossDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in."""
    from cake_core.build import source_digest

    return {**MANIFEST, "source_digest": source_digest(Path(__file__).parent)}
