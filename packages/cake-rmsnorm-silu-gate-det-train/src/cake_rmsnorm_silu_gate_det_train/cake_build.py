"""Build manifest of cake-rmsnorm-silu-gate-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-rmsnorm-silu-gate-det-train",
    "import_name": "cake_rmsnorm_silu_gate_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["rmsnorm_silu_gate_det", "rmsnorm_silu_gate_det_fwd",
                     "rmsnorm_silu_gate_det_bwd", "RMSNormGated"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_rmsnorm_silu_gate_det_train.kernels.fwd",
         "function": "rmsnorm_silu_gate_fwd_kernel"},
        {"module": "cake_rmsnorm_silu_gate_det_train.kernels.bwd",
         "function": "rmsnorm_silu_gate_bwd_kernel"},
        # the ordered dweight sum (shared)
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["RMSNormSiluGateDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in."""
    from cake_core.build import source_digest

    return {**MANIFEST, "source_digest": source_digest(Path(__file__).parent)}
