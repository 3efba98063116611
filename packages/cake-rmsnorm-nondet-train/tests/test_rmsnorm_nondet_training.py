"""RMSNormNondet in a tiny training step: torch.nn.RMSNorm's state_dict, gradients close to
torch's, a loss that falls."""

import torch
from _rmsnorm_nd_cases import DEV
from cake_core.testing import randn
from cake_rmsnorm_det_train import RMSNorm
from cake_rmsnorm_nondet_train import RMSNormNondet


def _model(norm):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), norm, torch.nn.Linear(48, 4)).to(DEV)


def test_state_dict_as_torch_and_det():
    m = RMSNormNondet(48, eps=1e-6)
    assert m.state_dict().keys() == torch.nn.RMSNorm(48).state_dict().keys()
    m.load_state_dict(RMSNorm(48).state_dict())
    assert not isinstance(m, RMSNorm) and not isinstance(RMSNorm(48), RMSNormNondet)


def test_training_steps_track_torch():
    x = randn((16, 32), torch.float32, DEV, seed=1)
    target = randn((16, 4), torch.float32, DEV, seed=2)
    ours, ref = _model(RMSNormNondet(48, eps=1e-6)), _model(torch.nn.RMSNorm(48, eps=1e-6))
    ref.load_state_dict(ours.state_dict())
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
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-4,
                               atol=1e-5)
    torch.testing.assert_close(ours[1].weight, ref[1].weight, rtol=1e-4, atol=1e-5)
