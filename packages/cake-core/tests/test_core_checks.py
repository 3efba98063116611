"""Input checks: uniform ValueErrors."""

import pytest
import torch
from cake_core import (
    check_cu_seqlens,
    check_dtype,
    check_flag,
    check_last_dim_contiguous,
    check_ndim,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
)


def test_tensor_dtype_ndim_shape():
    x = torch.zeros(2, 3)
    assert check_tensor(x, "x") is x
    with pytest.raises(ValueError, match="x: expected a torch.Tensor"):
        check_tensor([1], "x")
    with pytest.raises(ValueError, match=r"x: expected dtype in \(bfloat16\), got float32"):
        check_dtype(x, "x", (torch.bfloat16,))
    with pytest.raises(ValueError, match=r"w: expected dtype in \(bfloat16\), got float32$"):
        check_dtype(x, "w", (torch.bfloat16, torch.bfloat16))  # a repeated dtype named once
    with pytest.raises(ValueError, match="x: expected 3-D"):
        check_ndim(x, "x", ndim=3)
    with pytest.raises(ValueError, match="at least 3-D"):
        check_ndim(x, "x", min_ndim=3)
    check_shape(x, "x", [None, 3])
    with pytest.raises(ValueError, match=r"x: expected shape \[\*, 4\], got \[2, 3\]"):
        check_shape(x, "x", [None, 4])
    # a layout, when given, follows the expected rank or sizes
    with pytest.raises(ValueError, match=r"^x: expected 3-D tensor \(\[B, T, D\], FLA's\), "
                                         r"got 2-D \(2, 3\)$"):
        check_ndim(x, "x", ndim=3, layout="[B, T, D], FLA's")
    with pytest.raises(ValueError, match=r"^x: expected at least 3-D tensor \(\[B, T, D\]\), "
                                         r"got 2-D \(2, 3\)$"):
        check_ndim(x, "x", min_ndim=3, layout="[B, T, D]")
    with pytest.raises(ValueError, match=r"^x: expected shape \[\*, 4\] \(\[T, D\]\), got "
                                         r"\[2, 3\]$"):
        check_shape(x, "x", [None, 4], layout="[T, D]")


def test_device_stride_scalar():
    a, b = torch.zeros(2), torch.zeros(2, device="meta")
    assert check_same_device(("a", a), ("n", None)) == a.device
    with pytest.raises(ValueError, match="b: on meta"):
        check_same_device(("a", a), ("b", b))
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        check_last_dim_contiguous(torch.zeros(4, 4).t(), "x")
    check_last_dim_contiguous(torch.zeros(4, 1).t(), "x")
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="eps"):
            check_positive_finite(bad, "eps")
    assert check_positive_finite(1e-6, "eps") == 1e-6


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_cu_seqlens_ok(dtype):
    check_cu_seqlens(torch.tensor([0, 0, 1, 5, 5, 9], dtype=dtype), 9)


@pytest.mark.parametrize("cu, n, msg", [
    (torch.tensor([0, 3], dtype=torch.float32), 3, "dtype"),
    (torch.tensor([[0, 3]], dtype=torch.int32), 3, "1-D"),
    (torch.tensor([0], dtype=torch.int32), 0, "at least 2"),
    (torch.tensor([1, 3], dtype=torch.int32), 3, "start at 0"),
    (torch.tensor([0, 4, 3], dtype=torch.int32), 3, "non-decreasing"),
    (torch.tensor([0, 2], dtype=torch.int32), 3, "end at the token count 3"),
    ([0, 3], 3, "torch.Tensor"),
])
def test_cu_seqlens_bad(cu, n, msg):
    with pytest.raises(ValueError, match=msg):
        check_cu_seqlens(cu, n)


def test_accumulator():
    from cake_core import check_accumulator

    check_accumulator(None, "main_grad", (2, 3))
    check_accumulator(torch.zeros(2, 3), "main_grad", (2, 3))
    for bad, msg in ((torch.zeros(3, 2), "shape"), (torch.zeros(2, 3, dtype=torch.float16),
                     "dtype"), (torch.zeros(3, 2).t(), "contiguous"), ([0.0], "Tensor")):
        with pytest.raises(ValueError, match=f"main_grad: .*{msg}"):
            check_accumulator(bad, "main_grad", (2, 3))


def test_flag():
    assert check_flag(True, "f") is True and check_flag(False, "f") is False
    for bad in (1, 0, None, "True", torch.tensor(True), 1.0):
        with pytest.raises(ValueError, match=r"^use_x: expected a bool, got "):
            check_flag(bad, "use_x")
    with pytest.raises(ValueError, match=r"^f: expected a bool, got 1$"):
        check_flag(1, "f")


def test_int():
    from cake_core import check_int

    assert check_int(3, "n", 1) == 3 and type(check_int(torch.tensor(3).item(), "n")) is int
    assert check_int(0, "n") == 0 and check_int(256, "K", 1, 256) == 256
    for bad in (0, -1, True, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"^n: expected an int >= 1, got "):
            check_int(bad, "n", 1)
    for bad in (0, 257, False, 16.0):
        with pytest.raises(ValueError, match=r"^K: must be an int in \[1, 256\], got "):
            check_int(bad, "K", 1, 256)


def test_float_dtype_and_device():
    from cake_core import check_device, check_float_dtype

    for dt in (torch.float32, torch.bfloat16, torch.float16):
        assert check_float_dtype(dt) is dt
    for bad in (torch.float64, torch.int32, "float32", None):
        with pytest.raises(ValueError, match=r"^dtype: expected float32, bfloat16 or float16"):
            check_float_dtype(bad)
    with pytest.raises(ValueError, match=r"^w_dtype: "):
        check_float_dtype(torch.float64, "w_dtype")
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("meta")).type == "meta"
    for bad in ("bogus", 3.5, None):
        with pytest.raises(ValueError, match=r"^device: "):
            check_device(bad)


def test_positive_finite_traces_under_dynamic_fullgraph_compile():
    """Breaker finding: ``math.isfinite`` of a Python float that dynamo traces (under
    ``dynamic=True`` even a constant default argument such as mHC's ``eps=1e-6``) is a graph
    break, so ``torch.compile(dynamic=True, fullgraph=True)`` of any entry checking its eps
    failed before reaching a kernel."""
    torch._dynamo.reset()

    def f(x, eps=1e-6):
        return x * check_positive_finite(eps, "eps")

    def g(x, e):
        return f(x) + f(x, e)

    cg = torch.compile(g, backend="eager", fullgraph=True, dynamic=True)
    for n in (3, 5):
        assert torch.equal(cg(torch.ones(n), 0.5), g(torch.ones(n), 0.5))
    with pytest.raises(ValueError, match="eps"):
        check_positive_finite(float("-inf"), "eps")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA only")
def test_cuda_device_queries_without_cuda_are_value_errors():
    """sm_count / device_signature of a CUDA device where there is no CUDA: a ValueError
    that says why (torch raises an AssertionError there), so that every plan rule reading
    them (mhc's token slices, GDN's state_programs) refuses such a device clearly."""
    from cake_core.triton_utils import (
        CPU_SHARED_MEMORY,
        device_signature,
        max_shared_memory,
        sm_count,
    )
    cuda = torch.device("cuda")
    for query in (sm_count, device_signature, max_shared_memory):
        with pytest.raises(ValueError, match="CUDA is not available here"):
            query(cuda)
    assert sm_count(torch.device("cpu")) == 4
    assert device_signature(torch.device("cpu")) == "cpu-interpreter"
    assert max_shared_memory(torch.device("cpu")) == CPU_SHARED_MEMORY == 232448


def test_max_shared_memory_reads_the_opt_in_limit(monkeypatch):
    """CUDA: the device's opt-in per-block limit as torch reports it; 99 KiB (the smallest
    of the GPUs Triton 3.6 serves with bf16) where a torch build does not report it."""
    import types

    from cake_core import triton_utils

    cuda = torch.device("cuda", 0)
    for reported, want in ((232448, 232448), (166912, 166912), (101376, 101376), (0, 101376),
                           (None, 101376)):
        props = types.SimpleNamespace(multi_processor_count=132)
        if reported is not None:
            props.shared_memory_per_block_optin = reported
        monkeypatch.setattr(triton_utils, "_cuda_properties", lambda d, p=props: p)
        assert triton_utils.max_shared_memory(cuda) == want


def test_check_alloc_device():
    from cake_core.checks import check_alloc_device

    assert check_alloc_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device: "):
        check_alloc_device("not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here"):
            check_alloc_device("cuda")

