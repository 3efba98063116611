"""The SavedSet base: what a forward keeps for its backward."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from cake_core.mode import Mode


class SavedSet:
    """Tensors (and plain metadata) a family's forward keeps for its backward.

    Carries ``mode`` and ``format_version``; a det backward refuses a saved set of another
    type or mode (:func:`cake_core.require_mode`). It is the low-level API's currency
    (``<op>_fwd`` returns one, ``<op>_bwd`` takes one). Inside autograd a family saves the
    same tensors with ``ctx.save_for_backward`` (``tensors()`` / ``from_tensors()`` give the
    order), never as ctx attributes, so ``torch.utils.checkpoint`` and saved-tensor hooks
    work.

    Subclasses set ``tensor_names`` (the order of ``tensors()``) and ``format_version``.
    """

    tensor_names: ClassVar[tuple[str, ...]] = ()
    format_version: ClassVar[int] = 1

    def __init__(self, mode: Mode, tensors: dict[str, torch.Tensor | None],
                 meta: dict[str, Any] | None = None):
        missing = set(self.tensor_names) - set(tensors)
        if missing:
            raise ValueError(f"{type(self).__name__}: missing tensors {sorted(missing)}")
        # no Mode() call for a Mode: torch 2.11's dynamo cannot trace the enum's
        # constructor, and mHC builds its saved set inside torch.compile(fullgraph=True)
        self.mode = mode if isinstance(mode, Mode) else Mode(mode)
        self.version = self.format_version
        self._tensors = {n: tensors[n] for n in self.tensor_names}
        self.meta: dict[str, Any] = dict(meta or {})

    def __getattr__(self, name: str) -> Any:
        tensors = self.__dict__.get("_tensors", {})
        if name in tensors:
            return tensors[name]
        meta = self.__dict__.get("meta", {})
        if name in meta:
            return meta[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The tensors in ``tensor_names`` order, for ``ctx.save_for_backward``."""
        return tuple(self._tensors[n] for n in self.tensor_names)

    @classmethod
    def from_tensors(cls, mode: Mode, tensors: tuple[torch.Tensor | None, ...],
                     meta: dict[str, Any] | None = None):
        """Rebuild from ``ctx.saved_tensors`` (same order as ``tensors()``)."""
        return cls(mode, dict(zip(cls.tensor_names, tensors, strict=True)), meta)

    def __repr__(self) -> str:
        shapes = {n: (tuple(t.shape) if t is not None else None) for n, t in self._tensors.items()}
        return f"{type(self).__name__}(mode={self.mode}, version={self.version}, {shapes})"
