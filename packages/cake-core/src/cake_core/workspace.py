"""The Workspace base: scratch and accumulation buffers owned for one plan on one device."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from cake_core.mode import Mode
from cake_core.plan import Plan


class Workspace:
    """Named buffers allocated for one plan on one device.

    A workspace carries the mode and key of the plan it was made for. Kernels never
    allocate: the entry point allocates a workspace (or takes the caller's) and launches.

    Args:
        plan: the plan the buffers are sized for.
        device: where the buffers live.
        buffers: name -> tensor, all on ``device``.

    Raises:
        ValueError: if a buffer is not a tensor on ``device``.
    """

    def __init__(self, plan: Plan, device: torch.device | str,
                 buffers: Mapping[str, torch.Tensor]):
        self.plan = plan
        self.mode: Mode = plan.mode
        self.plan_key: str = plan.key
        self.device = torch.device(device)
        self._buffers: dict[str, torch.Tensor] = {}
        for name, t in buffers.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"workspace buffer {name!r}: expected a tensor, got {type(t)}")
            if t.device != self.device and not (
                self.device.index is None and t.device.type == self.device.type
            ):
                raise ValueError(
                    f"workspace buffer {name!r} is on {t.device}, workspace on {self.device}"
                )
            self._buffers[name] = t
        if self._buffers:
            self.device = next(iter(self._buffers.values())).device

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._buffers[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._buffers)

    @property
    def nbytes(self) -> int:
        """Total bytes held by the buffers."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def check(self, plan: Plan, device: torch.device, *, name: str = "workspace") -> None:
        """Raise ``ValueError`` unless this workspace was made for ``plan`` on ``device``."""
        if self.mode != plan.mode:
            raise ValueError(
                f"{name}: {type(self).__name__} has mode={self.mode}, the call runs "
                f"mode={plan.mode}"
            )
        # plans compared by equality (equal fields, equal key): under torch.compile the
        # cached key of a freshly made plan cannot be traced; the workspace's own plan key
        # (cached when it was built) is compared too, so a changed plan_key is refused
        if self.plan_key != self.plan.key or (self.plan is not plan and self.plan != plan):
            raise ValueError(
                f"{name}: {type(self).__name__} was made for plan {self.plan_key} "
                f"({self.plan.to_dict()}), the call uses plan {plan.key} ({plan.to_dict()})"
            )
        device = torch.device(device)
        if self.device.type != device.type or (
            device.index is not None and self.device.index not in (None, device.index)
        ):
            raise ValueError(f"{name}: buffers are on {self.device}, inputs on {device}")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mode={self.mode}, plan={self.plan_key}, "
                f"device={self.device}, nbytes={self.nbytes})")
