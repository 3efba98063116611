"""benchmarks/offline_build_wgrad.py hands the kernels' own argument names to the offline
sm_90 build (checked here without compiling: the build is swapped for a name check)."""

import importlib.util
import sys
from pathlib import Path

import cake_core.gemm  # noqa: F401  (the backend is picked before the test unsets the env)
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "offline_build_wgrad.py"


@pytest.mark.parametrize("args", [[], ["--main-grad"], ["--dtype", "fp16"]])
def test_offline_build_script_names_every_kernel_argument(monkeypatch, capsys, args):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the script refuses the interpreter
    spec = importlib.util.spec_from_file_location("offline_build_wgrad", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    built = []

    def check(fn, types, consts, div16, num_warps, num_stages):
        # every argument typed or constant, nothing the kernel does not take
        assert set(types) | set(consts) >= set(fn.arg_names), \
            f"{fn.__name__}: untyped {sorted(set(fn.arg_names) - set(types) - set(consts))}"
        assert set(consts) <= set(fn.arg_names), \
            f"{fn.__name__}: unknown constexprs {sorted(set(consts) - set(fn.arg_names))}"
        assert set(div16) <= set(fn.arg_names)
        built.append(fn.__name__)
        return 0, 0, 0, {}, {}

    monkeypatch.setattr(mod, "build", check)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    mod.main()
    assert "matmul_kernel" in built and "matmul_tma_kernel" in built
    assert "tma-persist" in capsys.readouterr().out
