"""Type stub of the legacy name cake_kda_train."""

import cake_kda_det_train_kcp as kcp
from cake_kda_det_train import KDADetGrads as KDADetGrads
from cake_kda_det_train import KDADetGrads as KDAGrads
from cake_kda_det_train import KDADetPlan as KDADetPlan
from cake_kda_det_train import KDADetPlan as KDAPlan
from cake_kda_det_train import KDADetSavedSet as KDADetSavedSet
from cake_kda_det_train import KDADetSavedSet as KDASavedSet
from cake_kda_det_train import KDADetWorkspace as KDADetWorkspace
from cake_kda_det_train import KDADetWorkspace as KDAWorkspace
from cake_kda_det_train import chunk_kda_det as chunk_kda
from cake_kda_det_train import chunk_kda_det as chunk_kda_det
from cake_kda_det_train import chunk_kda_det_bwd as chunk_kda_bwd
from cake_kda_det_train import chunk_kda_det_bwd as chunk_kda_det_bwd
from cake_kda_det_train import chunk_kda_det_fwd as chunk_kda_det_fwd
from cake_kda_det_train import chunk_kda_det_fwd as chunk_kda_fwd
from cake_kda_det_train import kda_gate_ref as kda_gate_ref
from cake_kda_det_train import kda_recurrence_ref as kda_recurrence_ref
from cake_kda_det_train import make_plan as make_plan
from cake_kda_det_train_kcp import KDADetKCPGrads as KDADetKCPGrads
from cake_kda_det_train_kcp import KDADetKCPGrads as KDAKCPGrads
from cake_kda_det_train_kcp import KDADetKCPSavedSet as KDADetKCPSavedSet
from cake_kda_det_train_kcp import KDADetKCPSavedSet as KDAKCPSavedSet
from cake_kda_det_train_kcp import KDADetKCPWorkspace as KDADetKCPWorkspace
from cake_kda_det_train_kcp import KDADetKCPWorkspace as KDAKCPWorkspace
from cake_kda_det_train_kcp import build_context_det_kcp as build_context_det_kcp
from cake_kda_det_train_kcp import build_context_det_kcp as build_context_kcp
from cake_kda_det_train_kcp import chunk_kda_det_bwd_kcp as chunk_kda_bwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_bwd_kcp as chunk_kda_det_bwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_fwd_kcp as chunk_kda_det_fwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_fwd_kcp as chunk_kda_fwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_kcp as chunk_kda_det_kcp
from cake_kda_det_train_kcp import chunk_kda_det_kcp as chunk_kda_kcp
from cake_kda_det_train_kcp import exchange_bytes as exchange_bytes
from cake_kda_det_train_kcp import partition_det_kcp as partition_det_kcp
from cake_kda_det_train_kcp import partition_det_kcp as partition_kcp

__version__: str

__all__ = [
    "KDADetGrads",
    "KDADetKCPGrads",
    "KDADetKCPSavedSet",
    "KDADetKCPWorkspace",
    "KDADetPlan",
    "KDADetSavedSet",
    "KDADetWorkspace",
    "KDAGrads",
    "KDAKCPGrads",
    "KDAKCPSavedSet",
    "KDAKCPWorkspace",
    "KDAPlan",
    "KDASavedSet",
    "KDAWorkspace",
    "__version__",
    "build_context_det_kcp",
    "build_context_kcp",
    "chunk_kda",
    "chunk_kda_bwd",
    "chunk_kda_bwd_kcp",
    "chunk_kda_det",
    "chunk_kda_det_bwd",
    "chunk_kda_det_bwd_kcp",
    "chunk_kda_det_fwd",
    "chunk_kda_det_fwd_kcp",
    "chunk_kda_det_kcp",
    "chunk_kda_fwd",
    "chunk_kda_fwd_kcp",
    "chunk_kda_kcp",
    "exchange_bytes",
    "kcp",
    "kda_gate_ref",
    "kda_recurrence_ref",
    "make_plan",
    "partition_det_kcp",
    "partition_kcp",
]
