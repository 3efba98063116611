"""What one training step of a patched Qwen3-Next reads back on the host, found by running it.

The benchmark's ``cake-graph`` run captures the whole step in a CUDA graph, where a host read
of a device value fails the capture. Here the tiny model's step runs on the CPU (Triton's
interpreter) under a dispatch mode that records every aten op that hands tensor values to
Python or sizes its output by them: ``_local_scalar_dense`` (``.item()``, ``int()``,
``float()``, ``bool()``, ``if t:``), ``nonzero``, ``masked_select``, ``unique``, ``bincount``,
``equal``, ``allclose``, boolean-mask indexing and ``repeat_interleave`` without
``output_size``. As the graph's warm-up, one step runs first (caches filled); then the step
is scanned eagerly, and with capture simulated (``torch.cuda.is_current_stream_capturing``
True: transformers' ``is_tracing`` and cake's ``holds`` take their capture branches).

Every read found must be one of :data:`CPU_ONLY` (reads of CPU tensors on a CPU that take
another branch on CUDA) or, eagerly, transformers' packed-sequence check, which it skips under
capture. Not seen by a CPU run: ``.tolist()``, ``.cpu()``, ``.numpy()`` of device tensors
and host-to-device copies (shared/tests/test_det_host_sync_audit.py reads the det sources
for those).
"""

import os
import traceback

import pytest
import torch
from cake_core.triton_utils import is_interpreting
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.skipif(not is_interpreting(), reason=(
    "a CPU scan under Triton's interpreter; on CUDA the benchmark's cake-graph run captures"))

pytest.importorskip("transformers")
from cake_transformers import _common, apply_cake_kernels_to_qwen3_next  # noqa: E402
from cake_transformers._common import holds  # noqa: E402
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM  # noqa: E402

_ATEN = torch.ops.aten
#: ops that give Python a device value, or whose output size depends on one (a sync on CUDA)
_READS = {_ATEN._local_scalar_dense, _ATEN.is_nonzero, _ATEN.item, _ATEN.nonzero,
          _ATEN.masked_select, _ATEN.unique_consecutive, _ATEN._unique2, _ATEN.unique_dim,
          _ATEN.bincount, _ATEN.equal, _ATEN.allclose}
_INDEXING = {_ATEN.index, _ATEN.index_put, _ATEN.index_put_}

#: (file, function) -> why the read is no sync on CUDA
CPU_ONLY = {
    ("api.py", "_check_group_sizes"): "cake-moe-grouped-det-gemm reads offs on the CPU only; "
                                      "on CUDA the check returns before any read",
    ("api.py", "_check_labels"): "cake-lm-head-loss-det-train: the CPU rule's plan has "
                                 "check_labels = 1, the CUDA rule's 0 reads no label",
    ("_common.py", "holds"): "cake-transformers: under a CUDA capture a device assertion "
                             "(torch._assert_async) instead of bool()",
}
#: transformers' eager packed-sequence check (masking_utils.find_packed_sequence_indices:
#: ``bool((mask[:, -1] == 0).all())``), skipped under capture (``is_tracing``)
EAGER_ONLY = ("masking_utils.py", "find_packed_sequence_indices")


def tiny_model():
    """Two layers (a Gated DeltaNet and a gated full attention, each with a sparse MoE of 4
    experts, top 2, and a shared expert), as test_transformers_qwen3_next's, fp32."""
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1, max_position_embeddings=128,
        use_cache=False, output_router_logits=False)
    return Qwen3NextForCausalLM(cfg).float().train()


def _is_read(func, args, kwargs) -> bool:
    pk = func.overloadpacket
    if pk in _READS:
        return True
    if func is _ATEN.repeat_interleave.Tensor or func is _ATEN.repeat_interleave.self_Tensor:
        return kwargs.get("output_size") is None
    if pk in _INDEXING:
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in args[1] if i is not None)
    return False


class _HostReads(TorchDispatchMode):
    """Records ``(file, function, line)`` of the innermost non-torch Python frame of each
    host read."""

    def __init__(self):
        super().__init__()
        self.sites = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_read(func, args, kwargs):
            here = os.path.abspath(__file__)
            frames = [f for f in traceback.extract_stack()
                      if f"{os.sep}torch{os.sep}" not in f.filename and
                      os.path.abspath(f.filename) != here]
            f = frames[-1]
            self.sites.append((os.path.basename(f.filename), f.name, f.lineno, str(func)))
        return func(*args, **kwargs)


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()


@pytest.fixture(scope="module")
def scans():
    """``{"eager": sites, "capture": sites, "tables_built": n}`` of one scanned step each,
    after a warm-up step."""
    import cake_core.varlen as varlen

    model = apply_cake_kernels_to_qwen3_next(tiny_model())
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    _step(model, ids)  # the warm-up: chunk tables and plans made here
    built = []
    real_build = varlen._build_chunks
    mp = pytest.MonkeyPatch()
    mp.setattr(varlen, "_build_chunks", lambda *a: built.append(a) or real_build(*a))
    out = {}
    try:
        for name in ("eager", "capture"):
            if name == "capture":
                mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
            scan = _HostReads()
            with scan:
                _step(model, ids)
            out[name] = scan.sites
    finally:
        mp.undo()
    out["tables_built"] = len(built)
    return out


def _unexplained(sites, allowed):
    return [s for s in sites if s[:2] not in allowed]


def test_eager_step_reads_only_cpu_branches_and_transformers_mask_check(scans):
    allowed = {**CPU_ONLY, EAGER_ONLY: "transformers, eager only"}
    assert not _unexplained(scans["eager"], allowed), scans["eager"]
    # transformers' packed-sequence check is there eagerly: the capture scan below shows
    # what changes when it is skipped
    assert any(s[:2] == EAGER_ONLY for s in scans["eager"]), scans["eager"]


def test_captured_step_reads_only_cpu_branches(scans):
    sites = scans["capture"]
    assert not _unexplained(sites, CPU_ONLY), sites
    assert not any(s[:2] == EAGER_ONLY for s in sites), sites
    # under capture transformers materializes the 4-D causal mask; the patched attention
    # checks it through holds (a device assertion on CUDA)
    assert any(s[:2] == ("_common.py", "holds") for s in sites), sites


def test_step_after_warm_up_builds_no_chunk_tables(scans):
    # what a capture would upload: the warm-up made the fixed-length rows' tables
    assert scans["tables_built"] == 0


class _NoBool:
    is_cuda = True

    def __bool__(self):
        raise AssertionError("host read of a device condition under capture")


def test_holds_asserts_on_the_device_under_capture(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch, "_assert_async", lambda c, msg: calls.append((c, msg)))
    cond = _NoBool()
    assert holds(cond, "why") is True
    assert calls == [(cond, "why")]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert holds(torch.tensor(False), "why") is False and len(calls) == 1


def test_mask_verdicts_are_not_shared_between_eager_calls_and_a_capture(monkeypatch):
    """is_plain_causal keeps the last mask's verdict (one check per forward, not per layer).
    An eager verdict must not stand in for the check a captured graph asserts at every
    replay (a static mask's values change between replays), and a capture's True (only
    asserted later, on the device) must not pass an eager call of the same mask."""
    checks = []
    real = _common.holds
    monkeypatch.setattr(_common, "holds", lambda c, m: checks.append(m) or real(c, m))
    monkeypatch.setattr(torch, "_assert_async", lambda c, msg: None)
    monkeypatch.setattr(_common, "_LAST_MASK", [None])
    T = 5
    padded = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
    padded[..., 0] = False  # a padding mask: the first key hidden
    causal = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
    assert _common.is_plain_causal(causal, T, T) and len(checks) == 1
    assert _common.is_plain_causal(causal, T, T) and len(checks) == 1  # the verdict kept
    monkeypatch.setattr(_common, "_capturing", lambda t: True)
    assert _common.is_plain_causal(causal, T, T) and len(checks) == 2  # asserted in the graph
    assert _common.is_plain_causal(causal, T, T) and len(checks) == 3  # every captured call
    assert _common.is_plain_causal(padded, T, T) and len(checks) == 4  # True, assert captured
    monkeypatch.setattr(_common, "_capturing", lambda t: False)
    assert not _common.is_plain_causal(padded, T, T) and len(checks) == 5  # checked eagerly
