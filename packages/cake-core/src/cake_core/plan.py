"""The Plan base: frozen, hashable, serialisable execution plans."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from cake_core.mode import Mode

P = TypeVar("P", bound="Plan")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Base of every family plan.

    A plan is a frozen dataclass of plain fields (ints, floats, bools, strings, the mode)
    chosen by rules from shapes, dtypes and device properties, never by timing. Two calls
    with equal plans launch the same kernels with the same reduction order.

    Subclasses are ``@dataclasses.dataclass(frozen=True)`` and set ``family`` (the
    canonical distribution name) and ``format_version``.
    """

    family: ClassVar[str] = "cake-core"
    format_version: ClassVar[int] = 1
    #: How to bring a dict of an older format version to this one, per version: appended to
    #: :meth:`from_dict`'s refusal (families fill it when they add fields).
    format_upgrades: ClassVar[dict[int, str]] = {}
    mode: Mode = dataclasses.field(default=Mode.DET, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float, bool, str)) or v is None:
                raise ValueError(
                    f"{type(self).__name__}.{f.name}: plan fields must be int, float, bool or "
                    f"str, got {type(v).__name__}"
                )

    # ---- field checks family plans call from their own __post_init__ (ValueError each) ----

    def _fail(self, what: str) -> None:
        raise ValueError(f"{type(self).__name__}: {what}")

    def require_int_fields(self) -> None:
        """Every field but ``mode`` is exactly ``int`` (no bool, float or numpy scalar), so
        the plan crosses a custom op as ``list[int]``."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "mode" and type(v) is not int:
                self._fail(f"{f.name} must be an int, got {v!r}")

    def require_power_of_two(self, *names: str, minimum: int = 1) -> None:
        for n in names:
            v = getattr(self, n)
            if v < minimum or v & (v - 1):
                more = f" >= {minimum}" if minimum > 1 else ""
                self._fail(f"{n} must be a power of two{more}, got {v}")

    def require_at_least(self, *names: str, minimum: int = 1) -> None:
        for n in names:
            if getattr(self, n) < minimum:
                self._fail(f"{n} must be >= {minimum}, got {getattr(self, n)}")

    def require_in_range(self, name: str, lo: int, hi: int) -> None:
        v = getattr(self, name)
        if not lo <= v <= hi:
            self._fail(f"{name} must be in [{lo}, {hi}], got {v}")

    def require_flags(self, *names: str) -> None:
        for n in names:
            if getattr(self, n) not in (0, 1):
                self._fail(f"{n} must be 0 or 1, got {getattr(self, n)}")

    def require_warps(self, *names: str) -> None:
        for n in names:
            if getattr(self, n) not in (1, 2, 4, 8, 16, 32):
                self._fail(f"{n} must be 1, 2, 4, 8, 16 or 32, got {getattr(self, n)}")

    def require_mode(self, mode: Mode) -> None:
        if self.mode != mode:
            self._fail(f"mode must be {mode}, got {self.mode}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, with ``family``, ``plan`` (class name) and ``version``."""
        d: dict[str, Any] = {"family": self.family, "plan": type(self).__name__,
                             "version": self.format_version}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = v.value if isinstance(v, Mode) else v
        return d

    @classmethod
    def from_dict(cls: type[P], d: dict[str, Any]) -> P:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: if the dict names another plan class or format version, or has
                unknown or missing fields.
        """
        d = dict(d)
        plan_name = d.pop("plan", cls.__name__)
        version = d.pop("version", cls.format_version)
        d.pop("family", None)
        if plan_name != cls.__name__:
            raise ValueError(f"from_dict: dict describes {plan_name}, not {cls.__name__}")
        if version != cls.format_version:
            how = cls.format_upgrades.get(version) if isinstance(version, int) else None
            raise ValueError(
                f"from_dict: {cls.__name__} format version {version} is not "
                f"{cls.format_version}"
                + (f": {how}, or re-make the plan with make_plan" if how else "")
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"from_dict: unknown {cls.__name__} fields {sorted(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:  # missing fields
            raise ValueError(f"from_dict: {e}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def key(self) -> str:
        """Stable key: the same across processes and machines for equal plans."""
        digest = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
        return f"{type(self).__name__}:{digest}"


#: Most plans one :func:`cached_plan` cache holds before it is emptied.
MAX_CACHED_PLANS = 1024


def cached_plan(cache: dict, key: tuple, rule: Callable[[], P]) -> P:
    """``rule()`` memoised in ``cache`` under ``key`` (a plan rule is a pure function of its
    key, so caching saves host time and changes nothing; a full cache, ``MAX_CACHED_PLANS``
    entries, is emptied first, so rules keyed on token counts do not grow it without bound).
    Under ``torch.compile`` the rule runs directly: it is traced once, and a cache lookup
    would only add guards."""
    import torch

    if torch.compiler.is_compiling():
        return rule()
    plan = cache.get(key)
    if plan is None:
        if len(cache) >= MAX_CACHED_PLANS:
            cache.clear()  # keys may include a token count: bound the memory, not the answers
        plan = cache[key] = rule()
    return plan
