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
    runner = next(iter(model._plan_cache.runners()))
    as_python_op = "torch.utils.checkpoint.CheckpointFunction" in runner.export.python_ops
    assert as_python_op == (custom_autograd == "1")


@pytest.mark.parametrize("reentrant", [True, False])
def test_memory_opt_level_strips_the_checkpoint_and_recomputes(strict, monkeypatch, reentrant):
    """ORTMODULE_MEMORY_OPT_LEVEL=1 with torch.utils.checkpoint (it raised
    CheckpointNotAllowedError): as in ORT, the checkpoint is traced inline and the engine's
    layer-wise recompute takes its place; losses and gradients stay eager's."""
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    torch.manual_seed(0)
    eager = Checkpointed(reentrant)
    ours = ORTModule(copy.deepcopy(eager))
    x = torch.randn(6, 4)
    loss_e, loss_o = eager(x), ours(x)
    loss_e.backward()
    loss_o.backward()
    torch.testing.assert_close(loss_o, loss_e)
    for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_o.grad, p_e.grad, msg=name)
    assert next(iter(ours._plan_cache.runners())).export.python_ops == []  # no CheckpointFunction PythonOp


def test_memory_opt_level_with_hugging_face_gradient_checkpointing(strict, monkeypatch):
    import model_zoo

    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    torch.manual_seed(0)
    eager = model_zoo.gpt2()
    inner = copy.deepcopy(eager)
    inner.gradient_checkpointing_enable()
    ours = ORTModule(inner)
    _, batch = model_zoo.lm_batch(4, 16, torch.Generator().manual_seed(0))
    loss_e, loss_o = eager(**batch).loss, ours(**batch).loss
    loss_e.backward()
    loss_o.backward()
    assert loss_o.item() == pytest.approx(loss_e.item(), rel=1e-5)
    for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_o.grad, p_e.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ours._last_engine.stats()["recompute_nodes"] > 0  # the engine recomputes the layers
