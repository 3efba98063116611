"""Type stub of the legacy name cake_gdn_train.

``from cake_gdn_train import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_gdn_train import <old spelling>`` works); a star import does not bind it.
"""

from cake_gdn_det_train_kcp import GDNDetKCPGrads as GDNDetKCPGrads
from cake_gdn_det_train_kcp import GDNDetKCPSavedSet as GDNDetKCPSavedSet
from cake_gdn_det_train_kcp import GDNDetKCPWorkspace as GDNDetKCPWorkspace
from cake_gdn_det_train_kcp import __version__ as __version__
from cake_gdn_det_train_kcp import build_context_det_kcp as build_context_det_kcp
from cake_gdn_det_train_kcp import chunk_gated_delta_rule_det_kcp as chunk_gated_delta_rule_det_kcp
from cake_gdn_det_train_kcp import chunk_gdn_det_bwd_kcp as chunk_gdn_det_bwd_kcp
from cake_gdn_det_train_kcp import chunk_gdn_det_fwd_kcp as chunk_gdn_det_fwd_kcp
from cake_gdn_det_train_kcp import comm_bytes as comm_bytes
from cake_gdn_det_train_kcp import is_supported as is_supported
from cake_gdn_det_train_kcp import partition_det_kcp as partition_det_kcp
from cake_gdn_det_train_kcp import saved_bytes as saved_bytes
from cake_gdn_det_train_kcp import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
GDNKCPGrads = GDNDetKCPGrads
GDNKCPSavedSet = GDNDetKCPSavedSet
GDNKCPWorkspace = GDNDetKCPWorkspace
build_context_kcp = build_context_det_kcp
chunk_gated_delta_rule_kcp = chunk_gated_delta_rule_det_kcp
chunk_gdn_bwd_kcp = chunk_gdn_det_bwd_kcp
chunk_gdn_fwd_kcp = chunk_gdn_det_fwd_kcp
partition_kcp = partition_det_kcp

__all__ = [
    "GDNDetKCPGrads",
    "GDNDetKCPSavedSet",
    "GDNDetKCPWorkspace",
    "__version__",
    "build_context_det_kcp",
    "chunk_gated_delta_rule_det_kcp",
    "chunk_gdn_det_bwd_kcp",
    "chunk_gdn_det_fwd_kcp",
    "comm_bytes",
    "is_supported",
    "partition_det_kcp",
    "saved_bytes",
    "workspace_bytes",
]
