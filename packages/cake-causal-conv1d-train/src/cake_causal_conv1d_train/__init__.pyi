"""Type stub of the legacy name cake_causal_conv1d_train.

``from cake_causal_conv1d_train import *`` binds the names of the runtime ``__all__``: the
canonical names and ``kcp``. Each old spelling is bound to its canonical name below
(``from cake_causal_conv1d_train import <old spelling>`` works); a star import does not bind it.
"""

import cake_causal_conv1d_det_train_kcp as kcp
from cake_causal_conv1d_det_train import CausalConv1dDetGrads as CausalConv1dDetGrads
from cake_causal_conv1d_det_train import CausalConv1dDetPlan as CausalConv1dDetPlan
from cake_causal_conv1d_det_train import CausalConv1dDetSavedSet as CausalConv1dDetSavedSet
from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace as CausalConv1dDetWorkspace
from cake_causal_conv1d_det_train import ShortConvolution as ShortConvolution
from cake_causal_conv1d_det_train import causal_conv1d_det as causal_conv1d_det
from cake_causal_conv1d_det_train import causal_conv1d_det_bwd as causal_conv1d_det_bwd
from cake_causal_conv1d_det_train import causal_conv1d_det_fwd as causal_conv1d_det_fwd
from cake_causal_conv1d_det_train import causal_conv1d_reference as causal_conv1d_reference
from cake_causal_conv1d_det_train import is_supported as is_supported
from cake_causal_conv1d_det_train import make_plan as make_plan
from cake_causal_conv1d_det_train import saved_bytes as saved_bytes
from cake_causal_conv1d_det_train import workspace_bytes as workspace_bytes
from cake_causal_conv1d_det_train_kcp import CausalConv1dDetKCPGrads as CausalConv1dDetKCPGrads
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPSavedSet as CausalConv1dDetKCPSavedSet,
)
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPWorkspace as CausalConv1dDetKCPWorkspace,
)
from cake_causal_conv1d_det_train_kcp import build_context_det_kcp as build_context_det_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_bwd_kcp as causal_conv1d_det_bwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_fwd_kcp as causal_conv1d_det_fwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_kcp as causal_conv1d_det_kcp
from cake_causal_conv1d_det_train_kcp import comm_bytes as comm_bytes
from cake_causal_conv1d_det_train_kcp import partition_det_kcp as partition_det_kcp

__version__: str

# old spellings (the same objects; not in __all__)
CausalConv1dGrads = CausalConv1dDetGrads
CausalConv1dPlan = CausalConv1dDetPlan
CausalConv1dSavedSet = CausalConv1dDetSavedSet
CausalConv1dWorkspace = CausalConv1dDetWorkspace
causal_conv1d = causal_conv1d_det
causal_conv1d_bwd = causal_conv1d_det_bwd
causal_conv1d_fwd = causal_conv1d_det_fwd
CausalConv1dKCPGrads = CausalConv1dDetKCPGrads
CausalConv1dKCPSavedSet = CausalConv1dDetKCPSavedSet
CausalConv1dKCPWorkspace = CausalConv1dDetKCPWorkspace
build_context_kcp = build_context_det_kcp
causal_conv1d_bwd_kcp = causal_conv1d_det_bwd_kcp
causal_conv1d_fwd_kcp = causal_conv1d_det_fwd_kcp
causal_conv1d_kcp = causal_conv1d_det_kcp
partition_kcp = partition_det_kcp

__all__ = [
    "CausalConv1dDetGrads",
    "CausalConv1dDetKCPGrads",
    "CausalConv1dDetKCPSavedSet",
    "CausalConv1dDetKCPWorkspace",
    "CausalConv1dDetPlan",
    "CausalConv1dDetSavedSet",
    "CausalConv1dDetWorkspace",
    "ShortConvolution",
    "build_context_det_kcp",
    "causal_conv1d_det",
    "causal_conv1d_det_bwd",
    "causal_conv1d_det_bwd_kcp",
    "causal_conv1d_det_fwd",
    "causal_conv1d_det_fwd_kcp",
    "causal_conv1d_det_kcp",
    "causal_conv1d_reference",
    "comm_bytes",
    "is_supported",
    "kcp",
    "make_plan",
    "partition_det_kcp",
    "saved_bytes",
    "workspace_bytes",
]
