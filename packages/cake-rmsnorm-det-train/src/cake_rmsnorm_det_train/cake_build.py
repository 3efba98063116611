"""Build manifest of cake-rmsnorm-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-rmsnorm-det-train",
    "import_name": "cake_rmsnorm_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["rmsnorm_det", "rmsnorm_det_fwd", "rmsnorm_det_bwd", "RMSNorm"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_rmsnorm_det_train.kernels.fwd", "function": "rmsnorm_fwd_kernel"},
        {"module": "cake_rmsnorm_det_train.kernels.bwd", "function": "rmsnorm_bwd_kernel"},
        {"module": "cake_rmsnorm_det_train.kernels.reduce", "function": "dweight_reduce_kernel"},
    ],
    "plans": ["RMSNormDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in."""
    from cake_core.build import source_digest

    return {**MANIFEST, "source_digest": source_digest(Path(__file__).parent)}
