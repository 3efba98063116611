"""Print a sha256 of the bits of RMSNorm outputs and gradients (cross-process repeat check).

Usage: python det_hash.py [T H dtype]   (defaults 32768 4096 bfloat16); run it twice in
separate processes and compare the printed lines.
"""

import hashlib
import sys

import torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import rmsnorm_det

T, H = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (32768, 4096)
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16
dev = default_device()
x = randn((T, H), dtype, dev, seed=1).requires_grad_()
r = randn((T, H), dtype, dev, seed=2).requires_grad_()
w = randn((H,), dtype, dev, seed=3).requires_grad_()
dy = randn((T, H), dtype, dev, seed=4)
y, h = rmsnorm_det(x, w, residual=r)
torch.autograd.backward([y, h], [dy, dy])
hsh = hashlib.sha256()
for t in (y, h, x.grad, r.grad, w.grad):
    hsh.update(bits(t).cpu().numpy().tobytes())
print(f"{T}x{H} {dtype} {hsh.hexdigest()}")
