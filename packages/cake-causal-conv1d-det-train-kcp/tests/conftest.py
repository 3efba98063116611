"""Puts this folder on ``sys.path`` so the tests (and the spawned workers) import their
shared helpers, ``_conv_kcp_helpers``, under a name no other package's tests use.

Triton's interpreter: nothing to set here. Without a CUDA device the sibling's kernel
package calls :func:`cake_core.triton_utils.select_backend` when it is imported, which sets
``TRITON_INTERPRET=1`` (unless already set) before any kernel is defined; the spawned
worker processes inherit the variable or make the same choice."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
