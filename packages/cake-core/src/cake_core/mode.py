"""Execution modes and the one mode check every family uses."""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    """Execution mode of a plan, workspace or saved set.

    ``DET``: bitwise repeatable for the same inputs, hardware, plan and initial
    accumulation buffers (no floating atomics, fixed reduction order).
    ``NONDET``: may use floating atomics or other order-dependent reductions.
    """

    DET = "det"
    NONDET = "nondet"

    def __str__(self) -> str:  # "det", not "Mode.DET", in messages and dicts
        return self.value


def require_mode(obj: object, expected_type: type | tuple[type, ...], mode: Mode = Mode.DET,
                 *, name: str = "object") -> None:
    """Raise ``ValueError`` unless ``obj`` is an ``expected_type`` carrying ``mode``.

    Args:
        obj: the saved set, workspace or plan handed to a det entry point.
        expected_type: the class (or classes) the entry point accepts.
        mode: the mode the entry point runs in (default ``Mode.DET``).
        name: how the argument is called in the message (``"saved"``, ``"workspace"``).

    Raises:
        ValueError: naming the argument, its actual type and mode, and what was expected.
    """
    types = expected_type if isinstance(expected_type, tuple) else (expected_type,)
    expected = " or ".join(t.__name__ for t in types)
    actual_mode = getattr(obj, "mode", None)
    if not isinstance(actual_mode, Mode):
        actual_mode = "none"
    if not isinstance(obj, types):
        raise ValueError(
            f"{name}: got {type(obj).__name__} (mode={actual_mode}), expected {expected} "
            f"with mode={mode}"
        )
    if actual_mode != mode:
        raise ValueError(
            f"{name}: got {type(obj).__name__} with mode={actual_mode}, expected {expected} "
            f"with mode={mode}"
        )
