"""Build manifest of cake-kda-det-train (plain data; format in cake_core.build).

``kernels`` lists every kernel a call launches: cake-core's L2 norm and ordered sum, this
package's gate, and the chunk kernels that ``cake_kda_det_train.chunk`` launches."""

from pathlib import Path

FAMILY = {
    "name": "cake-kda-det-train",
    "import_name": "cake_kda_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["chunk_kda_det", "chunk_kda_det_fwd", "chunk_kda_det_bwd"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        # the q/k L2 norm and the fixed-order dA_log / ddt_bias sum (cake-core's shared kernels)
        {"module": "cake_core.l2norm", "function": "l2norm_fwd_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
        {"module": "cake_kda_det_train.kernels.gate", "function": "kda_gate_fwd_kernel"},
        {"module": "cake_kda_det_train.kernels.gate", "function": "kda_gate_bwd_kernel"},
        {"module": "cake_kda_det_train.kernels.chunk_fwd", "function": "kda_fwd_prep_kernel"},
        {"module": "cake_kda_det_train.kernels.chunk_fwd", "function": "kda_fwd_h_kernel"},
        {"module": "cake_kda_det_train.kernels.chunk_fwd", "function": "kda_fwd_o_kernel"},
        {"module": "cake_kda_det_train.kernels.chunk_bwd", "function": "kda_bwd_dh_kernel"},
        {"module": "cake_kda_det_train.kernels.chunk_bwd", "function": "kda_bwd_local_kernel"},
    ],
    "plans": ["KDADetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in: this package's
    ``kernels/`` and cake-core's ``l2norm.py`` and ``gemm.py``, whose kernels it launches."""
    from cake_core.build import kernel_digest

    digest = kernel_digest(Path(__file__).parent,
                           ("cake_core.l2norm", "cake_core.gemm", "cake_core.triangular"))
    return {**MANIFEST, "source_digest": digest}
