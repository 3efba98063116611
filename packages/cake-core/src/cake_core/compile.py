"""Helpers for the ``torch.compile`` pattern every family follows.

Forward and backward are ``torch.library.custom_op``s over tensors and plain scalars, with
``register_fake`` and ``register_autograd``. A plan crosses the op boundary as its integer
fields (:func:`plan_to_op_fields`, a ``list[int]`` in the op schema; the op's name fixes the
mode) and is rebuilt inside with :func:`plan_from_op_fields`, so
``torch.compile(fullgraph=True)`` traces a model without graph breaks. An op's output
cannot be ``None``: an output that may not exist crosses as an empty fp32 ``[0]`` tensor
(:func:`optional_output`). Eagerly, an entry may call :func:`eager_function`'s
``autograd.Function`` over the same op body and autograd formula instead, or call
:func:`op_or_body` (the op while traced, else the body :func:`custom_op` kept): the same
launches and bits without the dispatcher's Python per call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import torch

from cake_core.mode import Mode
from cake_core.plan import Plan

P = TypeVar("P", bound=Plan)


def _names(cls_or_plan) -> list[str]:
    # dataclasses.fields of an instance: torch.compile traces that, not of a class.
    return [f.name for f in dataclasses.fields(cls_or_plan) if f.name != "mode"]


def plan_to_op_fields(plan: Plan) -> list[int]:
    """The plan's fields other than ``mode``, in declaration order, as ints.

    Raises:
        ValueError: if a field is not an int or bool.
    """
    out = []
    for n in _names(plan):
        v = getattr(plan, n)
        if not isinstance(v, (int, bool)):
            raise ValueError(f"{type(plan).__name__}.{n}: only int fields cross a custom op")
        out.append(int(v))
    return out


_PLANS: dict = {}  # (class, mode, fields) -> plan: plans are frozen, rebuilt once


def plan_from_op_fields(cls: type[P], values: list[int] | tuple[int, ...],
                        mode: Mode = Mode.DET) -> P:
    """Inverse of :func:`plan_to_op_fields` for plan class ``cls`` and ``mode`` (eagerly,
    one plan object per distinct fields, built and checked once)."""
    ints = tuple(int(v) for v in values)
    key = (cls, mode, ints)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    names = _names(cls)
    if len(names) != len(values):
        raise ValueError(f"{cls.__name__}: expected {len(names)} fields, got {len(values)}")
    plan = cls(**dict(zip(names, ints, strict=True)), mode=mode)
    if not torch.compiler.is_compiling():
        _PLANS[key] = plan
    return plan


_BODIES: dict[str, Callable] = {}  # "<namespace>::<name>" -> the op's Python body


def custom_op(qualname: str, *, mutates_args) -> Callable:
    """``torch.library.custom_op(qualname, mutates_args=...)`` as a decorator that also keeps
    the decorated Python body for eager calls (:func:`op_or_body`). Returns the op."""
    def register(fn: Callable):
        op = torch.library.custom_op(qualname, fn, mutates_args=mutates_args)
        _BODIES[qualname] = fn
        return op
    return register


def op_or_body(qualname: str) -> Callable:
    """``torch.ops.<namespace>.<name>`` while ``torch.compile`` traces (the op, its fake and
    its schema), else the body :func:`custom_op` registered: the same launches and bits,
    without the dispatcher's host time per call."""
    if torch.compiler.is_compiling():
        ns, name = qualname.split("::")
        return getattr(getattr(torch.ops, ns), name)
    return _BODIES[qualname]


def eager_function(name: str, body, setup_context, backward) -> type[torch.autograd.Function]:
    """An ``autograd.Function`` named ``name`` for eager calls of a custom op: ``forward``
    is the op's body, ``setup_context`` and ``backward`` its registered autograd (pass the
    same functions). Grads of unused outputs are materialised as zeros, as the op's autograd
    does, so both paths launch the same kernels on the same values. ``setup_context`` runs
    inside ``forward`` (a Function that defines its own ``setup_context`` pays an
    ``inspect.signature`` binding of its arguments on every ``apply``)."""

    def forward(ctx, *args):
        out = body(*args)
        setup_context(ctx, args, out)
        return out

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
    })


def optional_output(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A custom op's output that may not exist (a final state not asked for, the gradient of
    an absent input): ``t`` itself, or an empty fp32 ``[0]`` tensor on ``like``'s device
    when ``t`` is ``None``."""
    return t if t is not None else like.new_empty((0,), dtype=torch.float32)
