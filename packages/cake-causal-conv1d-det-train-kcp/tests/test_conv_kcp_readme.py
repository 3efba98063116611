"""The README's quick start runs as written, under torchrun with 2 ranks (gloo on the CPU,
NCCL with one GPU per rank)."""
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_on_two_ranks(tmp_path):
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("## Quick start"):], re.S).group(1)
    script = tmp_path / "conv_kcp.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for rank in (0, 1):
        assert f"{rank} (1, 32, 32) True (32, 4)" in done.stdout, done.stdout[-2000:]
