"""RMSNormGatedNondet in a tiny training step: the det module's state_dict, a loss that
falls and tracks the det module's."""

import torch
from _gate_norm_nd_cases import DEV
from cake_core.testing import randn
from cake_rmsnorm_silu_gate_det_train import RMSNormGated
from cake_rmsnorm_silu_gate_nondet_train import RMSNormGatedNondet


class _Block(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(32, 96)
        self.gate = torch.nn.Linear(32, 96)
        self.norm = norm
        self.out = torch.nn.Linear(96, 4)

    def forward(self, x):
        return self.out(self.norm(self.proj(x), self.gate(x)))


def test_training_steps_track_det():
    x = randn((16, 32), torch.float32, DEV, seed=1)
    target = randn((16, 4), torch.float32, DEV, seed=2)
    kw = dict(eps=1e-5, norm_before_gate=False, group_size=48)
    ours = _Block(RMSNormGatedNondet(96, **kw)).to(DEV)
    ref = _Block(RMSNormGated(96, **kw)).to(DEV)
    ref.load_state_dict(ours.state_dict())
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert not isinstance(ours.norm, RMSNormGated)
    assert not isinstance(ref.norm, RMSNormGatedNondet)
    losses = []
    for m in (ours, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0][-1] < losses[0][0]
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-5,
                               atol=1e-6)
    torch.testing.assert_close(ours.norm.weight, ref.norm.weight, rtol=1e-5, atol=1e-6)
