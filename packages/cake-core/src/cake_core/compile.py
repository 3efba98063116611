"""Helpers for the ``torch.compile`` pattern every family follows.

Forward and backward are ``torch.library.custom_op``s over tensors and plain scalars, with
``register_fake`` and ``register_autograd``. A plan crosses the op boundary as its integer
fields (:func:`plan_to_op_fields`, a ``list[int]`` in the op schema; the op's name fixes the
mode) and is rebuilt inside with :func:`plan_from_op_fields`, so
``torch.compile(fullgraph=True)`` traces a model without graph breaks. An op's output
cannot be ``None``: an output that may not exist crosses as an empty fp32 ``[0]`` tensor
(:func:`optional_output`).
"""

from __future__ import annotations

import dataclasses
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


def plan_from_op_fields(cls: type[P], values: list[int] | tuple[int, ...],
                        mode: Mode = Mode.DET) -> P:
    """Inverse of :func:`plan_to_op_fields` for plan class ``cls`` and ``mode``."""
    names = _names(cls)
    if len(names) != len(values):
        raise ValueError(f"{cls.__name__}: expected {len(names)} fields, got {len(values)}")
    return cls(**dict(zip(names, (int(v) for v in values), strict=True)), mode=mode)


def optional_output(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A custom op's output that may not exist (a final state not asked for, the gradient of
    an absent input): ``t`` itself, or an empty fp32 ``[0]`` tensor on ``like``'s device
    when ``t`` is ``None``."""
    return t if t is not None else like.new_empty((0,), dtype=torch.float32)
