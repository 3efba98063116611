"""Triton's interpreter and numpy: a missing or incompatible numpy is one ImportError that
names ``cake-core[interpreter]``, judged by the installed Triton's version; the version
table is cake-core's declared ``interpreter`` extra."""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from cake_core import backend

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover
    tomllib = None

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

FIX = 'pip install "cake-core[interpreter]"'


def _run(code: str, interpret: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": interpret,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env)


# numpy blocked (None in sys.modules: `import numpy` raises ImportError) or replaced by a
# module of another version, after torch is imported; then kernels are imported
_BLOCK = "import sys, torch; sys.modules['numpy'] = None; "
_FAKE = ("import sys, types, torch; m = types.ModuleType('numpy'); m.__version__ = '{v}'; "
         "sys.modules['numpy'] = m; ")
_IMPORT_KERNELS = (
    "import cake_core\n"
    "try:\n"
    "    import cake_core.gemm\n"
    "except ImportError as e:\n"
    "    print('IMPORTERROR', e)\n"
    "else:\n"
    "    print('IMPORTED')\n")


def _triton() -> str:
    return metadata.version("triton")


def test_missing_numpy_is_one_clear_error_under_the_interpreter():
    r = _run(_BLOCK + "\n" + _IMPORT_KERNELS, "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert out.startswith("IMPORTERROR numpy is missing"), out
    assert FIX in out and f"Triton {_triton()}'s interpreter" in out, out
    if backend._major_minor(_triton()) in backend.INTERPRETER_NUMPY:
        assert "needs numpy>=" in out, out


@pytest.mark.skipif(backend._major_minor(metadata.version("triton"))
                    not in backend.INTERPRETER_NUMPY,
                    reason="no numpy range recorded for this Triton")
def test_incompatible_numpy_is_one_clear_error_judged_by_triton():
    lo, hi = backend.INTERPRETER_NUMPY[backend._major_minor(_triton())]
    for v in (f"{hi[0]}.{hi[1]}.0", f"{lo[0]}.{lo[1] - 1}.0" if lo[1] else f"{lo[0] - 1}.0"):
        r = _run(_FAKE.format(v=v) + "\n" + _IMPORT_KERNELS, "1")
        assert r.returncode == 0, r.stderr
        out = r.stdout.strip()
        assert out.startswith(f"IMPORTERROR numpy {v} is installed"), out
        spec = f"numpy>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}"
        assert FIX in out and f"Triton {_triton()}'s interpreter needs {spec}" in out, out
    # inside the range: no complaint (the fake module is not used before the check)
    r = _run(_FAKE.format(v=f"{lo[0]}.{lo[1]}.1") + "\nfrom cake_core import backend\n"
             "print(backend.interpreter_numpy_problem())", "1")
    assert r.stdout.strip() == "None", (r.stdout, r.stderr)


def test_compiled_backend_does_not_ask_for_numpy():
    r = _run(_BLOCK + "from cake_core.backend import require_interpreter_numpy, "
             "select_backend\nrequire_interpreter_numpy(); print(select_backend())", "0")
    assert r.returncode == 0 and r.stdout.strip() == "cuda", (r.stdout, r.stderr)


def test_installed_numpy_passes():
    """The environment the tests run in (CI: numpy from noxfile.py's BASE) is in range."""
    assert backend.select_backend() != "interpreter" or backend.interpreter_numpy_problem() \
        is None


@pytest.mark.skipif(tomllib is None or not PYPROJECT.is_file(),
                    reason="needs cake-core's pyproject.toml and tomllib")
def test_numpy_table_is_the_interpreter_extra():
    """The range for the Triton cake-core admits is the one its ``interpreter`` extra
    installs."""
    meta = tomllib.loads(PYPROJECT.read_text())
    extra = meta["project"]["optional-dependencies"]["interpreter"]
    triton = [d for d in meta["project"]["dependencies"] if d.startswith("triton")]
    assert len(triton) == 1 and len(backend.INTERPRETER_NUMPY) == 1
    (major, minor), rng = next(iter(backend.INTERPRETER_NUMPY.items()))
    assert triton[0] == f"triton>={major}.{minor},<{major}.{minor + 1}"
    assert extra == [backend._spec(rng)]
