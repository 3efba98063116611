"""Type stub of the legacy name cake_causal_conv1d_train."""

import cake_causal_conv1d_det_train_kcp as kcp
from cake_causal_conv1d_det_train import CausalConv1dDetGrads as CausalConv1dDetGrads
from cake_causal_conv1d_det_train import CausalConv1dDetGrads as CausalConv1dGrads
from cake_causal_conv1d_det_train import CausalConv1dDetPlan as CausalConv1dDetPlan
from cake_causal_conv1d_det_train import CausalConv1dDetPlan as CausalConv1dPlan
from cake_causal_conv1d_det_train import CausalConv1dDetSavedSet as CausalConv1dDetSavedSet
from cake_causal_conv1d_det_train import CausalConv1dDetSavedSet as CausalConv1dSavedSet
from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace as CausalConv1dDetWorkspace
from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace as CausalConv1dWorkspace
from cake_causal_conv1d_det_train import ShortConvolution as ShortConvolution
from cake_causal_conv1d_det_train import causal_conv1d_det as causal_conv1d
from cake_causal_conv1d_det_train import causal_conv1d_det as causal_conv1d_det
from cake_causal_conv1d_det_train import causal_conv1d_det_bwd as causal_conv1d_bwd
from cake_causal_conv1d_det_train import causal_conv1d_det_bwd as causal_conv1d_det_bwd
from cake_causal_conv1d_det_train import causal_conv1d_det_fwd as causal_conv1d_det_fwd
from cake_causal_conv1d_det_train import causal_conv1d_det_fwd as causal_conv1d_fwd
from cake_causal_conv1d_det_train import causal_conv1d_reference as causal_conv1d_reference
from cake_causal_conv1d_det_train import make_plan as make_plan
from cake_causal_conv1d_det_train_kcp import CausalConv1dDetKCPGrads as CausalConv1dDetKCPGrads
from cake_causal_conv1d_det_train_kcp import CausalConv1dDetKCPGrads as CausalConv1dKCPGrads
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPSavedSet as CausalConv1dDetKCPSavedSet,
)
from cake_causal_conv1d_det_train_kcp import CausalConv1dDetKCPSavedSet as CausalConv1dKCPSavedSet
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPWorkspace as CausalConv1dDetKCPWorkspace,
)
from cake_causal_conv1d_det_train_kcp import CausalConv1dDetKCPWorkspace as CausalConv1dKCPWorkspace
from cake_causal_conv1d_det_train_kcp import build_context_det_kcp as build_context_det_kcp
from cake_causal_conv1d_det_train_kcp import build_context_det_kcp as build_context_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_bwd_kcp as causal_conv1d_bwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_bwd_kcp as causal_conv1d_det_bwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_fwd_kcp as causal_conv1d_det_fwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_fwd_kcp as causal_conv1d_fwd_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_kcp as causal_conv1d_det_kcp
from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_kcp as causal_conv1d_kcp
from cake_causal_conv1d_det_train_kcp import exchange_bytes as exchange_bytes
from cake_causal_conv1d_det_train_kcp import partition_det_kcp as partition_det_kcp
from cake_causal_conv1d_det_train_kcp import partition_det_kcp as partition_kcp

__version__: str

__all__ = [
    "CausalConv1dDetGrads",
    "CausalConv1dDetKCPGrads",
    "CausalConv1dDetKCPSavedSet",
    "CausalConv1dDetKCPWorkspace",
    "CausalConv1dDetPlan",
    "CausalConv1dDetSavedSet",
    "CausalConv1dDetWorkspace",
    "CausalConv1dGrads",
    "CausalConv1dKCPGrads",
    "CausalConv1dKCPSavedSet",
    "CausalConv1dKCPWorkspace",
    "CausalConv1dPlan",
    "CausalConv1dSavedSet",
    "CausalConv1dWorkspace",
    "ShortConvolution",
    "__version__",
    "build_context_det_kcp",
    "build_context_kcp",
    "causal_conv1d",
    "causal_conv1d_bwd",
    "causal_conv1d_bwd_kcp",
    "causal_conv1d_det",
    "causal_conv1d_det_bwd",
    "causal_conv1d_det_bwd_kcp",
    "causal_conv1d_det_fwd",
    "causal_conv1d_det_fwd_kcp",
    "causal_conv1d_det_kcp",
    "causal_conv1d_fwd",
    "causal_conv1d_fwd_kcp",
    "causal_conv1d_kcp",
    "causal_conv1d_reference",
    "exchange_bytes",
    "kcp",
    "make_plan",
    "partition_det_kcp",
    "partition_kcp",
]
