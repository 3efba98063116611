"""Build manifest of cake-moe-grouped-det-gemm (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-moe-grouped-det-gemm",
    "import_name": "cake_moe_grouped_det_gemm",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["moe_grouped_det_gemm", "moe_grouped_det_gemm_fwd",
                     "moe_grouped_det_gemm_bwd", "moe_feed_forward_det"],
}

MANIFEST = {
    **FAMILY,
    # the grouped GEMMs are this package's; the ordered sum of the wgrad partial planes is
    # cake-core's shared kernel
    "kernels": [
        {"module": "cake_moe_grouped_det_gemm.kernels.grouped", "function": "grouped_mm_kernel"},
        {"module": "cake_moe_grouped_det_gemm.kernels.grouped",
         "function": "grouped_wgrad_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["MoEGroupedDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in: this package's
    ``kernels/`` and cake-core's ``gemm.py``, whose ordered sum it launches."""
    import hashlib
    import importlib.util

    from cake_core.build import source_digest

    gemm = importlib.util.find_spec("cake_core.gemm").origin  # found, not imported (no Triton)
    h = hashlib.sha256(source_digest(Path(__file__).parent).encode() + b"\0")
    h.update(Path(gemm).read_bytes())
    return {**MANIFEST, "source_digest": "sha256:" + h.hexdigest()}
