"""The README's quick-start block runs as written."""
import pathlib

from cake_core.testing import run_readme_quick_start

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_block_runs():
    done = run_readme_quick_start(README)
    assert "torch.Size([1, 34, 2, 16]) torch.Size([2]) True" in done.stdout
