"""FLA's disable_recompute on the nondet entry: this package's rule plan with
keep_states = 1 (a nondet plan, made once in this package's cache), the default call's bits
with no recompute in the backward, a nondet plan given that recomputes refused before any
launch, off by truthiness. The checks live in cake_core.testing (shared with the det
entries)."""

import cake_kda_det_train.api as det_api
import cake_kda_det_train.chunk as det_chunk
import pytest
import torch
from _kda_nd_cases import DEV, cu_of, make
from cake_core import Mode
from cake_core.testing import (
    assert_disable_recompute_calls,
    assert_kept_plan_resolved,
    assert_recomputing_plan_refused,
)
from cake_kda_nondet_train import (
    KDANondetPlan,
    chunk_kda_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
)
from cake_kda_nondet_train.api import NONDET_KINDS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disable_recompute_is_the_rules_plan_kept(dtype):
    cu = cu_of([0, 1, 39, 30])
    leaves = list(make(1, 70, 1, 2, 16, 16, seed=11, raw=True, n_states=4))
    leaves[:3] = [t.to(dtype) for t in leaves[:3]]
    kept = assert_kept_plan_resolved(lambda **kw: det_api._resolve_plan(
        None, 16, 16, dtype, DEV, NONDET_KINDS, **kw))
    assert type(kept) is KDANondetPlan and kept.mode is Mode.NONDET
    # Kimi Linear's call: the L2 norm, the in-kernel gate and beta's sigmoid
    assert_disable_recompute_calls(chunk_kda_nondet, det_chunk, leaves, cu=cu, l2=True,
                                   gate=True, off=True,
                                   on=(dict(disable_recompute=True),
                                       dict(plan=kept, disable_recompute=True)))


def test_disable_recompute_with_a_recomputing_plan_refused():
    q, k, v, g, beta, *_ = make(1, 70, 1, 2, 16, 16, seed=13, h0=False)
    assert_recomputing_plan_refused(chunk_kda_nondet, is_supported_nondet, saved_bytes_nondet,
                                    det_api, dict(q=q, k=k, v=v, g=g, beta=beta),
                                    make_nondet_plan(16, 16, torch.float32, DEV))
