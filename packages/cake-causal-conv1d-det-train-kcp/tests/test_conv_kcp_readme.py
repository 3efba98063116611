"""The README's quick start runs as written, under torchrun with 2 ranks (gloo on the CPU,
NCCL with one GPU per rank)."""
import pathlib

from cake_core.testing import run_readme_quick_start_on_ranks

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_on_two_ranks(tmp_path):
    out = run_readme_quick_start_on_ranks(README, tmp_path)
    for rank in (0, 1):
        assert f"{rank} (1, 32, 32) True (32, 4)" in out[rank], out
