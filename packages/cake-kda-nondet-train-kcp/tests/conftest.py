"""Puts this folder on ``sys.path`` so the tests (and the spawned workers) import their
shared helpers, ``_kda_nd_kcp_helpers``, under a name no other package's tests use."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
