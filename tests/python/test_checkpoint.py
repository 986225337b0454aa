"""torch.utils.checkpoint inside ORTModule: a clear error unless ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1;
allowed, eager parity (as a PythonOp of the reentrant checkpoint, or inlined)."""
import copy

import pytest
import torch
import torch.utils.checkpoint as cp

from torch_ort import ORTModule
from torch_ort.ortmodule import CheckpointNotAllowedError


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.block = Block()
        self.out = torch.nn.Linear(8, 2)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        h = cp.checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.out(h).pow(2).mean()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_refused_unless_allowed(strict, reentrant):
    model = ORTModule(Checkpointed(reentrant))
    with pytest.raises(CheckpointNotAllowedError, match="ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1"):
        model(torch.randn(3, 4))


def test_checkpoint_refusal_is_not_silenced_by_the_default_policy():
    model = ORTModule(Checkpointed(True))
    with pytest.raises(CheckpointNotAllowedError):
        model(torch.randn(3, 4))


@pytest.mark.parametrize("custom_autograd", ["1", "0"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_allowed_checkpoint_matches_eager(strict, monkeypatch, reentrant, custom_autograd):
    monkeypatch.setenv("ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT", "1")
    monkeypatch.setenv("ORTMODULE_ENABLE_CUSTOM_AUTOGRAD", custom_autograd)
    torch.manual_seed(0)
    eager = Checkpointed(reentrant)
    ours = copy.deepcopy(eager)
    model = ORTModule(ours)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    for step in range(6):
        x = torch.randn(5, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        le, lo = eager(x), model(x2)
        le.backward()
        lo.backward()
        torch.testing.assert_close(lo, le, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-6)
        for (n, pe), po in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(po.grad, pe.grad, rtol=1e-5, atol=1e-6, msg=f"step {step} {n}")
        for opt in (opt_e, opt_o):
            opt.step()
            opt.zero_grad()
    runner = next(iter(model._runners.values()))
    as_python_op = "torch.utils.checkpoint.CheckpointFunction" in runner.export.python_ops
    assert as_python_op == (custom_autograd == "1")
