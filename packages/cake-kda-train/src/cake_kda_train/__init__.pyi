"""Type stub of the legacy name cake_kda_train.

``from cake_kda_train import *`` binds the names of the runtime ``__all__``: the
canonical names and ``kcp``. Each old spelling is bound to its canonical name below
(``from cake_kda_train import <old spelling>`` works); a star import does not bind it.
"""

import cake_kda_det_train_kcp as kcp
from cake_kda_det_train import KDADetGrads as KDADetGrads
from cake_kda_det_train import KDADetPlan as KDADetPlan
from cake_kda_det_train import KDADetSavedSet as KDADetSavedSet
from cake_kda_det_train import KDADetWorkspace as KDADetWorkspace
from cake_kda_det_train import KimiDeltaAttention as KimiDeltaAttention
from cake_kda_det_train import chunk_kda_det as chunk_kda_det
from cake_kda_det_train import chunk_kda_det_bwd as chunk_kda_det_bwd
from cake_kda_det_train import chunk_kda_det_fwd as chunk_kda_det_fwd
from cake_kda_det_train import is_supported as is_supported
from cake_kda_det_train import kda_gate_ref as kda_gate_ref
from cake_kda_det_train import kda_recurrence_ref as kda_recurrence_ref
from cake_kda_det_train import make_plan as make_plan
from cake_kda_det_train import saved_bytes as saved_bytes
from cake_kda_det_train import workspace_bytes as workspace_bytes
from cake_kda_det_train_kcp import KDADetKCPGrads as KDADetKCPGrads
from cake_kda_det_train_kcp import KDADetKCPSavedSet as KDADetKCPSavedSet
from cake_kda_det_train_kcp import KDADetKCPWorkspace as KDADetKCPWorkspace
from cake_kda_det_train_kcp import build_context_det_kcp as build_context_det_kcp
from cake_kda_det_train_kcp import chunk_kda_det_bwd_kcp as chunk_kda_det_bwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_fwd_kcp as chunk_kda_det_fwd_kcp
from cake_kda_det_train_kcp import chunk_kda_det_kcp as chunk_kda_det_kcp
from cake_kda_det_train_kcp import comm_bytes as comm_bytes
from cake_kda_det_train_kcp import partition_det_kcp as partition_det_kcp

__version__: str

# old spellings (the same objects; not in __all__)
KDAGrads = KDADetGrads
KDAPlan = KDADetPlan
KDASavedSet = KDADetSavedSet
KDAWorkspace = KDADetWorkspace
chunk_kda = chunk_kda_det
chunk_kda_bwd = chunk_kda_det_bwd
chunk_kda_fwd = chunk_kda_det_fwd
KDAKCPGrads = KDADetKCPGrads
KDAKCPSavedSet = KDADetKCPSavedSet
KDAKCPWorkspace = KDADetKCPWorkspace
build_context_kcp = build_context_det_kcp
chunk_kda_bwd_kcp = chunk_kda_det_bwd_kcp
chunk_kda_fwd_kcp = chunk_kda_det_fwd_kcp
chunk_kda_kcp = chunk_kda_det_kcp
partition_kcp = partition_det_kcp

__all__ = [
    "KDADetGrads",
    "KDADetKCPGrads",
    "KDADetKCPSavedSet",
    "KDADetKCPWorkspace",
    "KDADetPlan",
    "KDADetSavedSet",
    "KDADetWorkspace",
    "KimiDeltaAttention",
    "build_context_det_kcp",
    "chunk_kda_det",
    "chunk_kda_det_bwd",
    "chunk_kda_det_bwd_kcp",
    "chunk_kda_det_fwd",
    "chunk_kda_det_fwd_kcp",
    "chunk_kda_det_kcp",
    "comm_bytes",
    "is_supported",
    "kcp",
    "kda_gate_ref",
    "kda_recurrence_ref",
    "make_plan",
    "partition_det_kcp",
    "saved_bytes",
    "workspace_bytes",
]
