"""The README's quick-start block runs as written (a new user copies it first)."""
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_block_runs():
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("## Quick start"):], re.S).group(1)
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch.Size([2, 16, 96]) True True torch.float32 torch.Size([2, 16, 8])" in done.stdout
