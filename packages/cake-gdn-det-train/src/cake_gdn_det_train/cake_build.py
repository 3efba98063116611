"""Build manifest of cake-gdn-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-gdn-det-train",
    "import_name": "cake_gdn_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["chunk_gated_delta_rule_det", "chunk_gdn_det_fwd", "chunk_gdn_det_bwd"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        # the q/k L2 norm and the fixed-order dA_log / ddt_bias sum (cake-core's shared kernels)
        {"module": "cake_core.l2norm", "function": "l2norm_fwd_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
        {"module": "cake_gdn_det_train.kernels.gate", "function": "gdn_gate_fwd_kernel"},
        {"module": "cake_gdn_det_train.kernels.gate", "function": "gdn_gate_bwd_kernel"},
        {"module": "cake_gdn_det_train.kernels.fwd_prep", "function": "gdn_fwd_prep_kernel"},
        {"module": "cake_gdn_det_train.kernels.fwd_h", "function": "gdn_fwd_h_kernel"},
        {"module": "cake_gdn_det_train.kernels.fwd_o", "function": "gdn_fwd_o_kernel"},
        {"module": "cake_gdn_det_train.kernels.bwd_dh", "function": "gdn_bwd_dh_kernel"},
        {"module": "cake_gdn_det_train.kernels.bwd_local", "function": "gdn_bwd_local_kernel"},
    ],
    "plans": ["GDNDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in: this package's
    ``kernels/`` and cake-core's ``l2norm.py`` and ``gemm.py``, whose kernels it launches."""
    from cake_core.build import kernel_digest

    digest = kernel_digest(Path(__file__).parent,
                           ("cake_core.l2norm", "cake_core.gemm", "cake_core.triangular"))
    return {**MANIFEST, "source_digest": digest}
