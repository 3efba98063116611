"""Where cake's Triton kernels run, decided once per process without importing Triton.

:func:`select_backend` is the CUDA-or-interpreter rule: a CUDA device present -> kernels
compile for the GPU; no CUDA device and ``TRITON_INTERPRET`` unset -> cake sets
``TRITON_INTERPRET=1`` so kernels run on the CPU through Triton's interpreter. Setting
``TRITON_INTERPRET`` yourself always wins. ``import cake_core`` applies it, so that a
process that imports a cake family and then something that imports Triton (``torch.compile``
does) still gets Triton's interpreter mode on a machine without CUDA.
"""

from __future__ import annotations

import os
import sys

import torch

_BACKEND: str | None = None


def select_backend() -> str:
    """Decide, once per process, where Triton kernels run: ``"cuda"`` or ``"interpreter"``.

    Must run before Triton kernels are defined (family kernel modules call it at import).
    """
    global _BACKEND
    if _BACKEND is None:
        env = os.environ.get("TRITON_INTERPRET")
        if env is None and not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
            env = "1"
            if "triton" in sys.modules:
                import warnings

                warnings.warn(
                    "triton was imported before cake chose the interpreter; Triton's own "
                    "helpers (tl.zeros, tl.cdiv, ...) are then compiled-mode functions and "
                    "kernels fail. Import cake families first, or set TRITON_INTERPRET=1 "
                    "before importing triton.", RuntimeWarning, stacklevel=2)
        # the same truthy spellings Triton's own knob accepts
        truthy = env is not None and env.strip().lower() in ("1", "true", "yes", "on", "y")
        _BACKEND = "interpreter" if truthy else "cuda"
        if _BACKEND == "interpreter":
            _warn_numpy()
    return _BACKEND


def _warn_numpy() -> None:
    # Triton 3.6's interpreter runs loops with runtime bounds through int() of 1-element
    # numpy arrays, which numpy >= 2.4 refuses. Install cake-core[interpreter] (numpy<2.4).
    try:
        import numpy
    except ImportError:
        return
    major, minor = (int(p) for p in numpy.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        import warnings

        warnings.warn(
            f"numpy {numpy.__version__} breaks loops in Triton's interpreter; install "
            "'cake-core[interpreter]' (numpy<2.4) to run cake kernels on the CPU",
            RuntimeWarning, stacklevel=3)
