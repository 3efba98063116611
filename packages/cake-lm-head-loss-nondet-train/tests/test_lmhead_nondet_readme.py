"""The README's quick-start block runs as written."""
import pathlib

from cake_core.testing import run_readme_quick_start

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_block_runs():
    done = run_readme_quick_start(README)
    assert "torch.Size([]) True torch.Size([2, 24]) torch.Size([2, 24])" in done.stdout
