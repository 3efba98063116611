"""shared/gpu/launch_trace.py names the first launch that wrote other bits: a planted fault
in KDA's backward chunk kernel (one entry of dG changed after the launch) is found there,
and two clean calls give no difference (CPU, Triton's interpreter, tiny shapes)."""
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_planted_fault_is_named():
    import cake_core.triton_utils  # noqa: F401  (picks the interpreter first on a CPU)
    import cake_kda_det_train.chunk as ch

    sys.path.insert(0, str(ROOT / "shared" / "gpu"))
    import launch_trace as lt

    path = ROOT / "packages/cake-kda-det-train/benchmarks/bench_cake_kda_det_train.py"
    spec = importlib.util.spec_from_file_location("kda_bench_lt", path)
    b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b)
    b.DEV = "cpu"
    c = b.make_case(1, 70, 1, None, K=16, V=16)
    fn = b.cake_fn({})
    with lt.trace("cake_kda_det_train") as one:
        b.grads_of(fn, c)
    with lt.trace("cake_kda_det_train") as two:
        b.grads_of(fn, c)
    assert "kda_bwd_local_kernel" in [x[0] for x in one]
    # the chunk engine's kernels, launched from cake-core, are traced too
    assert {"chunk_state_fwd_kernel", "chunk_state_bwd_kernel",
            "chunk_output_kernel"} <= {x[0] for x in one}
    assert lt.first_difference(one, two) == "no difference"

    with lt.trace("cake_kda_det_train") as bad_log:
        real = ch.kda_bwd_local_kernel.fn

        class Bad:
            arg_names = real.arg_names

            def __getitem__(self, grid):
                launch = real[grid]

                def run(*a, **k):
                    out = launch(*a, **k)
                    a[list(real.arg_names).index("DG")].view(-1)[0] += 1.0
                    return out
                return run
        ch.kda_bwd_local_kernel = lt._Traced("kda_bwd_local_kernel", Bad(), bad_log)
        b.grads_of(fn, c)
    assert ch.kda_bwd_local_kernel is real  # restored
    msg = lt.first_difference(one, bad_log)
    assert msg.startswith("launch ") and "(kda_bwd_local_kernel): written" in msg, msg
    assert "'DG'" in msg and msg.endswith(": none"), msg
