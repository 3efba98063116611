"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_lm_head_loss_det_train.api as api
import pytest
import torch
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import lm_head_loss_det, lm_head_loss_det_bwd, lm_head_loss_det_fwd

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_forward_impl", "_backward_impl", "_run_chunks"):
        monkeypatch.setattr(api, name, boom)


def _h(shape=(6, 16), dtype=torch.float32):
    return randn(shape, dtype, DEV, seed=5)


def _w(V=10, H=16, dtype=torch.float32):
    return randn((V, H), dtype, DEV, seed=6)


def _y(shape=(6,), V=10):
    return (torch.arange(shape[0] if shape else 1) % V).reshape(shape).to(DEV)


CASES = {
    "hidden 1-D": (lambda: (_h((16,)), _w(), _y(())), {}, "hidden: expected a 2-D"),
    "hidden 4-D": (lambda: (_h((1, 2, 3, 16)), _w(), _y((6,))), {}, "hidden: expected a 2-D"),
    "hidden int": (lambda: (_h().to(torch.int32), _w(), _y()), {}, "hidden: expected dtype"),
    "hidden float64": (lambda: (_h().double(), _w().double(), _y()), {}, "hidden: expected dtype"),
    "hidden strided": (lambda: (_h((16, 6)).t(), _w(), _y()), {},
                       "hidden: last dimension must be contiguous"),
    "H = 0": (lambda: (_h((6, 0)), _w(H=0), _y()), {}, "last dimension"),
    "weight wrong H": (lambda: (_h(), _w(H=15), _y()), {}, r"weight: expected shape \[V, 16\]"),
    "weight transposed": (lambda: (_h(), _w().t().contiguous(), _y()), {},
                          r"weight: expected shape \[V, 16\] \(\[V, H\] = \[vocab, hidden\], "
                          r"torch.nn.Linear's layout of the LM head; a transposed \[H, V\] is "
                          r"not served\), got \[16, 10\]"),
    "weight 1-D": (lambda: (_h(), _h((16,)), _y()), {}, "weight: expected shape"),
    "V = 0": (lambda: (_h(), _w(V=0), _y()), {}, "vocabulary size"),
    "weight dtype": (lambda: (_h(), _w(dtype=torch.bfloat16), _y()), {},
                     "weight: expected dtype"),
    "labels int32": (lambda: (_h(), _w(), _y().to(torch.int32)), {}, "labels: expected dtype"),
    "labels float": (lambda: (_h(), _w(), _y().float()), {}, "labels: expected dtype"),
    "labels shape": (lambda: (_h(), _w(), _y((5,))), {}, r"labels: expected shape \[6\]"),
    "labels 3-D shape": (lambda: (_h((2, 3, 16)), _w(), _y((6,))), {},
                         r"labels: expected shape \[2, 3\]"),
    "label too large": (lambda: (_h(), _w(), _y() + 5), {}, r"labels: values must be in \[0, 10\)"),
    "label negative": (lambda: (_h(), _w(), _y() - 3), {}, "labels: values must be in"),
    "bias shape": (lambda: (_h(), _w(), _y()), {"bias": _h((9,))}, r"bias: expected shape \[10\]"),
    "bias dtype": (lambda: (_h(), _w(), _y()), {"bias": _h((10,), torch.float16)},
                   "bias: expected dtype"),
    "reduction": (lambda: (_h(), _w(), _y()), {"reduction": "avg"}, "reduction"),
    "smoothing > 1": (lambda: (_h(), _w(), _y()), {"label_smoothing": 1.5}, "label_smoothing"),
    "smoothing nan": (lambda: (_h(), _w(), _y()), {"label_smoothing": float("nan")},
                      "label_smoothing"),
    "z_loss < 0": (lambda: (_h(), _w(), _y()), {"z_loss": -1e-4}, "z_loss"),
    "softcap 0": (lambda: (_h(), _w(), _y()), {"logit_softcap": 0.0}, "logit_softcap"),
    "softcap inf": (lambda: (_h(), _w(), _y()), {"logit_softcap": float("inf")}, "logit_softcap"),
    "ignore_index float": (lambda: (_h(), _w(), _y()), {"ignore_index": -100.0}, "ignore_index"),
    "main_grad shape": (lambda: (_h(), _w(), _y()), {"main_grad": torch.zeros(10, 15)},
                        r"main_grad: expected shape \[10, 16\]"),
    "main_grad dtype": (lambda: (_h(), _w(), _y()),
                        {"main_grad": torch.zeros(10, 16, dtype=torch.bfloat16)},
                        "main_grad: expected dtype"),
    "main_grad strided": (lambda: (_h(), _w(), _y()), {"main_grad": torch.zeros(16, 10).t()},
                          r"main_grad: (expected shape|must be contiguous)"),
    "devices differ": (lambda: (_h(), torch.ones(10, 16, device="meta"), _y()), {},
                       "weight: on meta"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    if case.startswith("label ") and DEV.type != "cpu":
        pytest.skip("label values on a GPU are not read by the rule's plan (no host sync)")
    make, kw, msg = CASES[case]
    h, w, y = make()
    h.requires_grad_(h.is_floating_point())
    tensors = [t for t in (h, w, y, *kw.values()) if isinstance(t, torch.Tensor)
               and t.device.type != "meta"]
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(ValueError, match=msg):
        lm_head_loss_det(h, w, y, **kw)
    assert all(bitwise_equal(a, b.detach()) for a, b in zip(before, tensors, strict=True))
    if "main_grad" not in kw:
        with pytest.raises(ValueError, match=msg):
            lm_head_loss_det_fwd(h, w, y, **kw)


def test_non_tensor_inputs(no_launch):
    with pytest.raises(ValueError, match="hidden: expected a torch.Tensor"):
        lm_head_loss_det([[1.0]], _w(), _y())
    with pytest.raises(ValueError, match="weight: expected a torch.Tensor"):
        lm_head_loss_det(_h(), None, _y())
    with pytest.raises(ValueError, match="labels: expected a torch.Tensor"):
        lm_head_loss_det(_h(), _w(), [0, 1])


def test_bad_backward_inputs(monkeypatch):
    (loss, _), saved = lm_head_loss_det_fwd(_h(), _w(), _y(), reduction="none")
    monkeypatch.setattr(api, "_backward_impl", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("launched")))
    main_grad = torch.full((10, 16), 2.0)
    for dloss, kw, msg in (
            (torch.ones(()), {}, r"dloss: expected shape \[6\]"),
            (torch.ones(6, dtype=torch.float64), {}, "dloss: expected dtype"),
            (torch.ones(6), {"main_grad": torch.zeros(16, 10)}, "main_grad: expected shape"),
            (torch.ones(6), {"main_grad": main_grad.half()}, "main_grad: expected dtype")):
        with pytest.raises(ValueError, match=msg):
            lm_head_loss_det_bwd(dloss, saved, **kw)
    assert torch.equal(main_grad, torch.full((10, 16), 2.0))


def test_wrong_backend_device_refused(no_launch):
    if DEV.type == "cpu" and not torch.cuda.is_available():
        h = torch.ones(2, 4, device="meta")
        with pytest.raises(ValueError, match="hidden: on meta"):
            lm_head_loss_det(h, torch.ones(3, 4, device="meta"),
                             torch.zeros(2, dtype=torch.int64, device="meta"))
        return
    other = "cuda" if DEV.type == "cpu" else "cpu"
    with pytest.raises(ValueError, match="hidden: on"):
        lm_head_loss_det(torch.ones(2, 4, device=other), torch.ones(3, 4, device=other),
                         torch.zeros(2, dtype=torch.int64, device=other))


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_return_lse_must_be_a_bool(flag, no_launch):
    from cake_lm_head_loss_det_train import is_supported

    with pytest.raises(ValueError, match="return_lse: expected a bool"):
        lm_head_loss_det(_h(), _w(), _y(), return_lse=flag)
    got = is_supported(_h(), _w(), _y(), return_lse=flag)
    assert not got.ok and "return_lse" in got.reason


@pytest.mark.parametrize("args,kw,msg", [
    ((2.5, 10), {}, "hidden_size: expected an int"),
    ((True, 10), {}, "hidden_size: expected an int"),
    ((16, 0), {}, "vocab_size: expected an int >= 1"),
    ((16, 10), {"reduction": "avg"}, "reduction"),
    ((16, 10), {"label_smoothing": 2.0}, "label_smoothing"),
    ((16, 10), {"ignore_index": 1.5}, "ignore_index"),
    ((16, 10), {"z_loss": -1.0}, "z_loss"),
    ((16, 10), {"logit_softcap": 0.0}, "logit_softcap"),
])
def test_module_refuses_bad_options_when_built(args, kw, msg):
    from cake_lm_head_loss_det_train import LMHeadLoss

    with pytest.raises(ValueError, match=msg):
        LMHeadLoss(*args, **kw)
