"""Where cake's Triton kernels run, decided once per process without importing Triton.

:func:`select_backend` is the CUDA-or-interpreter rule: a CUDA device present -> kernels
compile for the GPU; no CUDA device and ``TRITON_INTERPRET`` unset -> cake sets
``TRITON_INTERPRET=1`` so kernels run on the CPU through Triton's interpreter. Setting
``TRITON_INTERPRET`` yourself always wins. ``import cake_core`` applies it, so that a
process that imports a cake family and then something that imports Triton (``torch.compile``
does) still gets Triton's interpreter mode on a machine without CUDA.

:func:`require_interpreter_numpy` (run by :mod:`cake_core.triton_utils` before it imports
Triton) turns a missing numpy, or one outside the range the installed Triton's interpreter
runs with, into one ``ImportError`` naming ``cake-core[interpreter]``.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

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
    return _BACKEND


#: Triton (major, minor) -> the numpy its interpreter runs with: (lowest, first excluded)
#: (major, minor) of numpy. Triton 3.6's interpreter imports numpy and runs loops with
#: runtime bounds through ``int()`` of 1-element arrays, which numpy >= 2.4 refuses. The
#: range is cake-core's ``interpreter`` extra (a test holds them equal).
INTERPRETER_NUMPY: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {
    (3, 6): ((1, 24), (2, 4)),
}


def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _spec(rng: tuple[tuple[int, int], tuple[int, int]]) -> str:
    (a, b), (c, d) = rng
    return f"numpy>={a}.{b},<{c}.{d}"


def interpreter_numpy_problem() -> str | None:
    """Why Triton's interpreter cannot run here for want of a suitable numpy, or ``None``.

    Judged by the installed Triton's version (:data:`INTERPRETER_NUMPY`): numpy missing (or
    failing to import), or outside the range that Triton's interpreter runs with. A Triton
    the table does not know (outside cake's declared range) needs numpy, at any version."""
    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = "?"
    rng = INTERPRETER_NUMPY.get(_major_minor(triton_version) or (-1, -1))
    need = _spec(rng) if rng else "numpy"
    fix = (f"cake kernels run here through Triton's interpreter (no CUDA device, or "
           f"TRITON_INTERPRET set), and Triton {triton_version}'s interpreter needs {need}: "
           'pip install "cake-core[interpreter]"')
    try:
        import numpy
    except ImportError as e:
        return f"numpy is missing ({e}); {fix}"
    got = _major_minor(getattr(numpy, "__version__", ""))
    if rng and (got is None or not rng[0] <= got < rng[1]):
        return f"numpy {getattr(numpy, '__version__', '?')} is installed; {fix}"
    return None


def require_interpreter_numpy() -> None:
    """Raise ``ImportError`` (one message naming ``cake-core[interpreter]``) when Triton's
    interpreter is the backend and numpy is missing or incompatible with the installed
    Triton. :mod:`cake_core.triton_utils` calls it before importing Triton, so a family's
    kernels fail to import with this message, not with Triton's ``No module named
    'numpy'`` or a numpy error deep inside a launch."""
    if select_backend() == "interpreter":
        problem = interpreter_numpy_problem()
        if problem is not None:
            raise ImportError(problem)
