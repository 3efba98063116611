"""The README's quick-start block runs as written (a new user copies it first)."""
import pathlib

from cake_core.testing import run_readme_quick_start

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_block_runs():
    done = run_readme_quick_start(README)
    assert ("torch.Size([1, 100, 4, 32]) torch.Size([2, 4, 32, 32]) "
            "torch.Size([1, 100, 2, 32])") in done.stdout
