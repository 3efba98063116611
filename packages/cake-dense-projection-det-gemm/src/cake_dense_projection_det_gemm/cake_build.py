"""Build manifest of cake-dense-projection-det-gemm (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-dense-projection-det-gemm",
    "import_name": "cake_dense_projection_det_gemm",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["dense_projection_det", "dense_projection_det_fwd",
                     "dense_projection_det_bwd", "Linear"],
}

MANIFEST = {
    **FAMILY,
    # the GEMMs are cake-core's shared kernels, re-exported by this package's kernels/
    "kernels": [
        {"module": "cake_core.gemm", "function": "matmul_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["DenseProjectionDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    """The manifest with the digest of the kernel sources filled in: this package's
    ``kernels/`` and cake-core's ``gemm.py``, whose kernels it launches."""
    import hashlib
    import importlib.util

    from cake_core.build import source_digest

    gemm = importlib.util.find_spec("cake_core.gemm").origin  # found, not imported (no Triton)
    h = hashlib.sha256(source_digest(Path(__file__).parent).encode() + b"\0")
    h.update(Path(gemm).read_bytes())
    return {**MANIFEST, "source_digest": "sha256:" + h.hexdigest()}
