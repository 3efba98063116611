"""Build manifest of cake-mhc-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-mhc-det-train",
    "import_name": "cake_mhc_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["mhc_det_prepare", "mhc_det_finish", "HyperConnection"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_mhc_det_train.kernels.fwd", "function": "mhc_mix_kernel"},
        {"module": "cake_mhc_det_train.kernels.fwd", "function": "mhc_coef_kernel"},
        {"module": "cake_mhc_det_train.kernels.finish", "function": "mhc_finish_fwd_kernel"},
        {"module": "cake_mhc_det_train.kernels.finish", "function": "mhc_finish_bwd_kernel"},
        {"module": "cake_mhc_det_train.kernels.bwd", "function": "mhc_bwd_coef_kernel"},
        {"module": "cake_mhc_det_train.kernels.bwd", "function": "mhc_bwd_dx_kernel"},
        {"module": "cake_mhc_det_train.kernels.bwd", "function": "rows_sum_kernel"},
    ],
    "plans": ["MHCDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in."""
    from cake_core.build import source_digest

    return {**MANIFEST, "source_digest": source_digest(Path(__file__).parent)}
