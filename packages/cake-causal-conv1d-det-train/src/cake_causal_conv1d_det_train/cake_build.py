"""Build manifest of cake-causal-conv1d-det-train (plain data; format in cake_core.build)."""

from pathlib import Path

FAMILY = {
    "name": "cake-causal-conv1d-det-train",
    "import_name": "cake_causal_conv1d_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["causal_conv1d_det", "causal_conv1d_det_fwd", "causal_conv1d_det_bwd",
                     "ShortConvolution"],
}

_K = "cake_causal_conv1d_det_train.kernels"

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": f"{_K}.fwd", "function": "causal_conv1d_fwd_kernel"},
        {"module": f"{_K}.bwd", "function": "causal_conv1d_bwd_kernel"},
        # the fixed-order sum of the dweight / dbias partials (cake-core's shared kernel)
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["CausalConv1dDetPlan"],
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
