"""Byte-level text data for the tiny LM: deterministic corpus selection, split, batches.

The default corpus is the Python standard library's own source on this machine
(``sysconfig.get_paths()["stdlib"]``): every ``*.py`` file outside ``site-packages`` and
test directories, in sorted relative-path order, concatenated until a fixed byte budget.
The same interpreter install therefore always yields the same bytes.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "DEFAULT_BYTES",
    "VAL_FRACTION",
    "ByteCorpus",
    "batch_starts",
    "get_batch",
    "load_corpus",
    "stdlib_files",
    "read_files",
    "split_train_val",
    "val_windows",
]

#: Default byte budget of the corpus (2 MiB).
DEFAULT_BYTES = 2 * 1024 * 1024
#: Fraction of the corpus held out (at its end) for validation.
VAL_FRACTION = 0.05

# Directory names never descended into when collecting the stdlib corpus.
_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


@dataclass(frozen=True)
class ByteCorpus:
    """A byte corpus and where it came from.

    Attributes:
        data: ``uint8`` CPU tensor ``[N]``, the raw bytes (tokens are byte values 0..255).
        source: human-readable description (root directory or file).
        files: relative paths of the files that contributed bytes, in order.
    """

    data: torch.Tensor
    source: str
    files: tuple[str, ...]

    @property
    def n_bytes(self) -> int:
        """Number of bytes (= tokens) in the corpus."""
        return int(self.data.numel())


def _skip_dir(name: str) -> bool:
    return name in _SKIP_DIRS or name.startswith(".")


def stdlib_files(root: str | os.PathLike[str] | None = None) -> list[str]:
    """List the stdlib ``*.py`` files used as the default corpus, deterministically.

    Args:
        root: directory to scan; defaults to ``sysconfig.get_paths()["stdlib"]``.

    Returns:
        Relative POSIX paths (``str``) of ``*.py`` files under ``root``, sorted, skipping any
        path through ``site-packages``, ``dist-packages``, ``__pycache__``, ``test``,
        ``tests``, ``idle_test`` or hidden directories.

    Raises:
        FileNotFoundError: if ``root`` is not a directory.
    """
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise FileNotFoundError(f"stdlib directory not found: {base}")
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if not _skip_dir(d)]
        rel_dir = Path(dirpath).relative_to(base)
        for fname in filenames:
            if fname.endswith(".py"):
                found.append((rel_dir / fname).as_posix())
    return sorted(found)


def read_files(
    base: str | os.PathLike[str], rel_paths: list[str], max_bytes: int | None
) -> tuple[bytes, tuple[str, ...]]:
    """Concatenate files in the given order until ``max_bytes`` (the last one is cut).

    Args:
        base: directory the relative paths are resolved against.
        rel_paths: relative paths, read in this order.
        max_bytes: byte budget; ``None`` reads everything.

    Returns:
        ``(data, used)``: the concatenated bytes (``len(data) <= max_bytes``) and the
        relative paths that contributed.

    Raises:
        ValueError: if ``max_bytes`` is not positive.
        OSError: if a file cannot be read.
    """
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    chunks: list[bytes] = []
    used: list[str] = []
    total = 0
    for rel in rel_paths:
        if max_bytes is not None and total >= max_bytes:
            break
        blob = (Path(base) / rel).read_bytes()
        if not blob:
            continue
        if max_bytes is not None:
            blob = blob[: max_bytes - total]
        chunks.append(blob)
        used.append(rel)
        total += len(blob)
    return b"".join(chunks), tuple(used)


def load_corpus(
    text: str | os.PathLike[str] | None = None, max_bytes: int | None = DEFAULT_BYTES
) -> ByteCorpus:
    """Load the training corpus as bytes.

    Args:
        text: ``None`` for the stdlib default corpus; a file path to use that file; a
            directory to use all its regular files (recursively, sorted relative paths,
            hidden entries skipped).
        max_bytes: byte budget (the concatenation is cut there); ``None`` for no limit.

    Returns:
        A :class:`ByteCorpus` with a ``uint8`` CPU tensor ``[N]``.

    Raises:
        FileNotFoundError: if ``text`` does not exist.
        ValueError: if ``max_bytes`` is not positive or the corpus is empty.
    """
    if text is None:
        base = Path(sysconfig.get_paths()["stdlib"])
        rel = stdlib_files(base)
    else:
        path = Path(text)
        if path.is_file():
            base, rel = path.parent, [path.name]
        elif path.is_dir():
            base = path
            rel = []
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel_dir = Path(dirpath).relative_to(path)
                rel.extend(
                    (rel_dir / f).as_posix()
                    for f in filenames
                    if not f.startswith(".") and (Path(dirpath) / f).is_file()
                )
            rel.sort()
        else:
            raise FileNotFoundError(f"--text path not found: {path}")
    blob, used = read_files(base, rel, max_bytes)
    if not blob:
        raise ValueError(f"corpus from {base if text is None else text} is empty")
    data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return ByteCorpus(data=data, source=str(base), files=used)


def split_train_val(
    data: torch.Tensor, val_fraction: float = VAL_FRACTION
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a 1-D token tensor into train (head) and validation (last ``val_fraction``).

    Args:
        data: 1-D tensor ``[N]`` (any integer dtype).
        val_fraction: fraction in ``(0, 1)`` held out at the end.

    Returns:
        ``(train, val)`` views of ``data``.

    Raises:
        ValueError: if ``data`` is not 1-D or ``val_fraction`` is outside ``(0, 1)``.
    """
    if data.dim() != 1:
        raise ValueError(f"data must be 1-D, got shape {tuple(data.shape)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = max(1, int(round(data.numel() * val_fraction)))
    return data[:-n_val], data[-n_val:]


def batch_starts(
    n_tokens: int, steps: int, batch_size: int, seq_len: int, seed: int
) -> torch.Tensor:
    """Draw every training batch's window offsets up front from a seeded generator.

    All runs of one job share this tensor, hence the same batch order.

    Args:
        n_tokens: length of the training split.
        steps: number of optimizer steps.
        batch_size: windows per step.
        seq_len: window length (each window needs ``seq_len + 1`` tokens).
        seed: seed of the ``torch.Generator`` (CPU).

    Returns:
        ``int64`` CPU tensor ``[steps, batch_size]`` of start offsets in
        ``[0, n_tokens - seq_len - 1]``.

    Raises:
        ValueError: if the split is too short for one window.
    """
    high = n_tokens - seq_len
    if high < 1:
        raise ValueError(
            f"training split has {n_tokens} tokens, need more than seq_len+1={seq_len + 1}"
        )
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, high, (steps, batch_size), generator=gen, dtype=torch.int64)


def get_batch(
    data: torch.Tensor, starts: torch.Tensor, seq_len: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather input/target windows.

    Args:
        data: ``uint8`` CPU tensor ``[N]``.
        starts: ``int64`` tensor ``[B]`` of offsets with ``start + seq_len < N``.
        seq_len: window length ``T``.
        device: where the returned tensors live.

    Returns:
        ``(x, y)``, both ``int64`` ``[B, T]``; ``y`` is ``x`` shifted by one byte.
    """
    idx = starts[:, None] + torch.arange(seq_len + 1, dtype=torch.int64)[None, :]
    win = data[idx].to(torch.int64)
    return win[:, :-1].to(device), win[:, 1:].to(device)


def val_windows(data: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Deterministic, non-overlapping validation window offsets.

    Args:
        data: 1-D validation tensor ``[N]``.
        seq_len: window length ``T``.
        max_windows: cap on the number of windows (evenly spread over the split).

    Returns:
        ``int64`` CPU tensor ``[W]`` of offsets, ``1 <= W <= max_windows``.

    Raises:
        ValueError: if the split is shorter than ``seq_len + 1`` or ``max_windows < 1``.
    """
    if max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    n_full = (data.numel() - 1) // seq_len
    if n_full < 1:
        raise ValueError(
            f"validation split has {data.numel()} tokens, need at least seq_len+1={seq_len + 1}"
        )
    all_starts = torch.arange(n_full, dtype=torch.int64) * seq_len
    if n_full <= max_windows:
        return all_starts
    pick = torch.linspace(0, n_full - 1, max_windows).round().to(torch.int64)
    return all_starts[pick]
