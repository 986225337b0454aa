"""A training forward's run context (the activations kept for backward) lives exactly as long as
the outputs that own it: a forward whose backward never runs — the loss raised, the output was only
evaluated, the step was abandoned — frees it with those outputs, without a garbage collection.
torch_ort._C.live_runs() counts (run contexts, backward runs) alive in the process."""
import gc

import pytest
import torch

import torch_ort
from torch_ort import ORTModule

from model_zoo import nanogpt, nanogpt_batch
from test_python_op import Net as FunctionNet


_BASE = (0, 0)


@pytest.fixture(autouse=True)
def _baseline():
    """Counts are process-wide: each test measures from what earlier tests left (collected)."""
    global _BASE
    gc.collect()
    _BASE = torch_ort._C.live_runs()


def _live():
    now = torch_ort._C.live_runs()
    return (now[0] - _BASE[0], now[1] - _BASE[1])


@pytest.fixture
def gpt(strict):
    torch.manual_seed(0)
    model = ORTModule(nanogpt())
    gen = torch.Generator().manual_seed(0)
    (idx, targets), _ = nanogpt_batch(4, 16, gen)
    model(idx, targets)[1].backward()  # exported and built: what follows measures runs only
    assert _live() == (0, 0)
    return model, idx, targets


def test_exception_in_the_loss_frees_the_run(gpt):
    model, idx, targets = gpt

    def step():
        logits, _ = model(idx)
        assert _live() == (1, 0)  # held by logits' autograd graph
        raise RuntimeError("the user's loss failed")

    with pytest.raises(RuntimeError, match="loss failed"):
        step()
    assert _live() == (0, 0)


def test_evaluating_a_train_mode_output_frees_the_run(gpt):
    model, idx, targets = gpt
    logits, loss = model(idx, targets)
    accuracy = (logits.argmax(-1) == targets).float().mean().item()  # evaluated, never backpropagated
    assert 0.0 <= accuracy <= 1.0 and _live() == (1, 0)
    del logits, loss
    assert _live() == (0, 0)


def test_many_abandoned_forwards_do_not_accumulate(gpt):
    model, idx, targets = gpt
    for _ in range(50):
        loss = model(idx, targets)[1]  # the previous loss (and its run) dies at this assignment
        assert _live() == (1, 0)
    del loss
    assert _live() == (0, 0)


def test_two_forwards_one_backward(gpt):
    model, idx, targets = gpt
    first = model(idx, targets)[1]
    second = model(idx, targets)[1]
    assert _live() == (2, 0)
    first.backward()
    assert _live() == (1, 0)  # first's context consumed and freed; second's still owned
    del first, second
    assert _live() == (0, 0)


def test_backward_of_early_gradients_only_frees_the_rest(gpt, monkeypatch):
    """autograd.grad asking for one early group: the backward run holding the remaining steps'
    activations is freed at the end of that backward call."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", "0.0001")  # a group per parameter
    torch.manual_seed(0)
    model = ORTModule(nanogpt())
    (idx, targets), _ = nanogpt_batch(4, 16, torch.Generator().manual_seed(0))
    loss = model(idx, targets)[1]
    head = model.module.ln_f.weight  # its gradient is final early in backward
    (g,) = torch.autograd.grad(loss, [head], retain_graph=False)
    assert g.shape == head.shape
    assert _live() == (0, 0)
    del loss
    assert _live() == (0, 0)


def test_a_python_op_forward_without_backward_frees_its_run(strict):
    model = ORTModule(FunctionNet("mask"))
    model(torch.randn(3, 6)).backward()
    out = model(torch.randn(3, 6))
    assert _live() == (1, 0)
    del out
    assert _live() == (0, 0)


def test_a_backward_that_fails_frees_its_run(strict):
    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise ValueError("backward of Boom")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return Boom.apply(self.fc(x)).sum()

    model = ORTModule(M())
    # (the Function's error comes out as the engine's KernelError carrying its message)
    with pytest.raises((ValueError, RuntimeError), match="backward of Boom"):
        model(torch.randn(2, 4)).backward()
    assert _live() == (0, 0)
