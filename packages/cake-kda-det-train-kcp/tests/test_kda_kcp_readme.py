"""The README's quick start runs as written, under torchrun with 2 ranks (gloo on the CPU,
NCCL with one GPU per rank)."""
import pathlib
import subprocess
import sys

from cake_core.testing import readme_quick_start

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_on_two_ranks(tmp_path):
    block = readme_quick_start(README)
    script = tmp_path / "kda_kcp.py"
    script.write_text(block)
    # each rank's output in its own file (the ranks' prints interleave on one stdout)
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "--redirects", "3", "--log-dir",
                           str(logs), str(script)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    out = {int(f.parent.name): f.read_text() for f in logs.rglob("stdout.log")}
    err = "".join(f.read_text() for f in logs.rglob("stderr.log"))
    assert done.returncode == 0, (done.stdout + done.stderr + err)[-3000:]
    for rank in (0, 1):
        assert f"{rank} (1, 50, 2, 32) True" in out[rank], out
