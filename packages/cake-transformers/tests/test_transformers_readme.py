"""The README's quick-start block runs as written (a new user copies it first)."""
import pathlib

import pytest
from cake_core.testing import run_readme_quick_start

pytest.importorskip("transformers")

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_block_runs():
    done = run_readme_quick_start(README)
    assert done.stdout.strip().endswith("True True"), done.stdout
