"""FLA's disable_recompute on the nondet entry: this package's rule plan with
keep_states = 1 (a nondet plan, made once in this package's cache), the default call's bits
with no recompute in the backward, a nondet plan given that recomputes refused before any
launch, off by truthiness. The checks live in cake_core.testing (shared with the det
entries)."""

import cake_gdn_det_train.api as det_api
import pytest
import torch
from _gdn_nd_cases import DEV, make_inputs
from cake_core import Mode
from cake_core.testing import (
    assert_disable_recompute_calls,
    assert_kept_plan_resolved,
    assert_recomputing_plan_refused,
)
from cake_gdn_nondet_train import (
    GDNNondetPlan,
    chunk_gated_delta_rule_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
)
from cake_gdn_nondet_train.api import NONDET

# packed: an empty document, then lengths 1, 39 and 30
CU = (0, 0, 1, 40, 70)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disable_recompute_is_the_rules_plan_kept(dtype):
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)
    leaves = make_inputs(1, 70, 1, 2, 16, 16, dtype, seed=11, n_states=len(CU) - 1, h0=True)
    kept = assert_kept_plan_resolved(lambda **kw: det_api._resolve_plan(
        None, 16, 16, dtype, DEV, state_programs=8, types=NONDET, **kw))
    assert type(kept) is GDNNondetPlan and kept.mode is Mode.NONDET
    # the L2 norm without the in-kernel gate
    assert_disable_recompute_calls(chunk_gated_delta_rule_nondet, det_api, leaves, cu=cu,
                                   l2=True, gate=False, off=True,
                                   on=(dict(disable_recompute=True),
                                       dict(plan=kept, disable_recompute=True)))


def test_disable_recompute_with_a_recomputing_plan_refused():
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 2, 16, 16, seed=13)
    assert_recomputing_plan_refused(chunk_gated_delta_rule_nondet, is_supported_nondet,
                                    saved_bytes_nondet, det_api,
                                    dict(q=q, k=k, v=v, g=g, beta=beta),
                                    make_nondet_plan(16, 16, torch.float32, DEV))
