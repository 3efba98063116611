"""Know before you launch: whether :func:`~cake_gqa_train.gqa` serves a call, and the bytes
its workspace and its saved set take, computed without allocating or launching (the same
rules as cake-gqa-det-train's queries, with :class:`GQAPlan` / :class:`GQAWorkspace`)."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of
from cake_gqa_det_train.entry import saved_nbytes

from cake_gqa_train.api import checked
from cake_gqa_train.plan import GQAPlan
from cake_gqa_train.saved import GQAWorkspace, workspace_shapes


def is_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor | None = None,
                 cu_seqlens_k: torch.Tensor | None = None, *,
                 max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                 softmax_scale: float | None = None, causal: bool = True,
                 window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                 return_lse: bool = False, plan: GQAPlan | None = None,
                 workspace: GQAWorkspace | None = None) -> Support:
    """Whether :func:`~cake_gqa_train.gqa` serves this call (same arguments):
    ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` gqa would raise. Runs gqa's checks only (packed input's offsets are
    read, as gqa reads them); allocates no output and launches nothing. Never raises
    ``ValueError``. (A backward under ``torch.use_deterministic_algorithms(True)`` is
    refused later, with ``RuntimeError``; that is no input check.)

    Example::

        import torch
        from cake_gqa_train import is_supported
        q, k, v = torch.randn(3, 2, 128, 4, 64).unbind(0)
        s = is_supported(q, k, v, softcap=-1.0)   # Support(ok=False, reason='softcap: ...')
    """
    return support_of(lambda: checked(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_size, softcap, return_lse, plan, workspace))


def workspace_bytes(plan: GQAPlan, device: torch.device | str | None = None,
                    num_heads: int | None = None, max_tokens: int | None = None,
                    num_kv_heads: int | None = None, max_kv_tokens: int | None = None) -> int:
    """The bytes ``GQAWorkspace.for_plan(plan, device, num_heads, max_tokens,
    num_kv_heads, max_kv_tokens)`` allocates (fp32 ``delta``, ``num_heads * max_tokens``
    values; fp32 ``dkv_accum``, ``2 * max_kv_tokens * num_kv_heads * head_dim``),
    computed without allocating; ``device`` may be left out.

    Raises:
        ValueError: as for_plan (a plan of another type, head counts < 1, token counts
            < 0, a bad device).

    Example::

        import torch
        from cake_gqa_train import make_plan, workspace_bytes
        n = workspace_bytes(make_plan(64, torch.float32, "cpu"), "cpu", 8, 1024, 2, 1024)
    """
    if device is not None:
        check_alloc_device(device)
    shapes = workspace_shapes(plan, num_heads, max_tokens, num_kv_heads, max_kv_tokens)
    return nbytes_of(shapes.values())


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor | None = None,
                cu_seqlens_k: torch.Tensor | None = None, *,
                max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                softmax_scale: float | None = None, causal: bool = True,
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                return_lse: bool = False, plan: GQAPlan | None = None,
                workspace: GQAWorkspace | None = None) -> int:
    """The bytes :func:`~cake_gqa_train.gqa`'s forward (same arguments) allocates and
    keeps for the backward: out (q's shape and dtype) and the fp32 lse (``Hq * Tq``
    values), plus a packed copy of a 4-D q, k or v whose batch and token strides do not
    merge. q, k, v and the offsets are the caller's and count nothing. Computed from
    shapes and dtypes; inputs on the meta device work (their offsets' values are then not
    checked).

    Raises:
        ValueError: as :func:`~cake_gqa_train.gqa`.

    Example::

        import torch
        from cake_gqa_train import saved_bytes
        q = torch.empty(8, 4096, 32, 128, dtype=torch.bfloat16, device="meta")
        k = v = torch.empty(8, 4096, 8, 128, dtype=torch.bfloat16, device="meta")
        n = saved_bytes(q, k, v)   # out 256 MiB + lse 4 MiB
    """
    prob, _, _ = checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_size, softcap, return_lse, plan,
                         workspace, meta_ok=True)
    return saved_nbytes(q, k, v, prob)
