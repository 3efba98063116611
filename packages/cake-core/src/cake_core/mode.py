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
        ValueError: naming the argument, its actual type and mode, and what was expected;
            or a saved set of another ``format_version`` than its class's (one made, then
            pickled, by another version of its package, whose tensors may mean other
            things).
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
    want = getattr(type(obj), "format_version", None)
    got = getattr(obj, "version", want)
    if want is not None and got != want:
        raise ValueError(
            f"{name}: a {type(obj).__name__} of format version {got}, but this version of "
            f"its package reads version {want} (made by another version: run the forward "
            f"again)"
        )


_ALERTED: set[str] = set()


def nondet_alert(what: str, det_entry: str) -> None:
    """The deterministic-algorithms alert of a non-deterministic (``nondet``) backward.

    Call it before any launch. Under ``torch.use_deterministic_algorithms(True)`` it raises
    ``RuntimeError`` naming the det entry point to use instead; with ``warn_only=True`` it
    warns once per ``what`` and process, then returns (the backward runs); otherwise it
    returns at once.

    Args:
        what: the backward, as its message names it (``"cake_gdn_nondet_train's backward"``).
        det_entry: the deterministic entry point to use instead
            (``"cake_gdn_det_train.chunk_gated_delta_rule_det"``).

    Example::

        nondet_alert("cake_rmsnorm_nondet_train's backward", "cake_rmsnorm_det_train.rmsnorm_det")
    """
    import torch

    if not torch.are_deterministic_algorithms_enabled():
        return
    msg = (f"{what} is not deterministic (it may sum with floating atomic adds or pick its "
           f"plan by timing); use {det_entry} for bitwise repeatable gradients")
    if not torch.is_deterministic_algorithms_warn_only_enabled():
        raise RuntimeError(msg)
    if what not in _ALERTED:
        _ALERTED.add(what)
        import warnings

        warnings.warn(msg, UserWarning, stacklevel=3)
