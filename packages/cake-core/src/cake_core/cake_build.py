"""Build manifest of cake-core (plain data; see cake_core.build)."""

FAMILY = {
    "name": "cake-core",
    "import_name": "cake_core",
    "version": "0.1.0",
    "mode": "none",
    "kind": "tool",
    "entry_points": ["Mode", "Plan", "Workspace", "SavedSet", "require_mode"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_core.triton_utils", "function": "dot"},
        {"module": "cake_core.gemm", "function": "matmul_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
        {"module": "cake_core.l2norm", "function": "l2norm_fwd_kernel"},
    ],
    "plans": [],
    "package_data": [],
    "source_digest": None,  # cake-core has no kernels/ folder; families digest what they use
}
