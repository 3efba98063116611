"""Lazy public names for family packages: importing a family (or its ``cake_build``
manifest, e.g. for family discovery) must not import Triton or the kernels."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping


def lazy_exports(package: str, mapping: Mapping[str, str], all_names: Iterable[str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Module ``__getattr__`` and ``__dir__`` for ``package``.

    ``mapping`` sends a public name to the submodule that defines it (``"rmsnorm_det":
    "api"``); the submodule is imported on first access. Use in a package ``__init__``::

        __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
    """
    names = sorted(all_names)

    def __getattr__(name: str) -> object:
        if name in mapping:
            return getattr(importlib.import_module(f"{package}.{mapping[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
