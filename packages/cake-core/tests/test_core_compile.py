"""cake_core.compile: an op's Python body for eager calls, the op itself under
torch.compile."""

import torch
from cake_core.compile import custom_op, op_or_body

CALLS = []


@custom_op("cake_core_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    CALLS.append(torch.compiler.is_compiling())
    return x * 2


@_twice.register_fake
def _twice_fake(x):
    return x.new_empty(x.shape)


def test_op_or_body_eager_body_and_traced_op():
    x = torch.arange(4.0)
    body = op_or_body("cake_core_test::twice")
    assert not isinstance(body, torch._ops.OpOverloadPacket)  # the plain function
    CALLS.clear()
    assert torch.equal(body(x), x * 2) and CALLS == [False]
    f = torch.compile(lambda t: op_or_body("cake_core_test::twice")(t) + 1, fullgraph=True,
                      backend="eager")
    assert torch.equal(f(x), x * 2 + 1)
    assert torch.equal(torch.ops.cake_core_test.twice(x), x * 2)
