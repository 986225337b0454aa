"""A custom torch.autograd.Function's backward runs however its apply is reached: called directly,
through a reference stored before the export (`self.fn = F.apply`, Megatron/Apex style), a partial,
a lambda, a module-level alias, a setup_context-style Function, a subclass inheriting forward.

Each Function's backward is deliberately NOT the derivative of its forward (x * w): a gradient
computed by differentiating the forward instead of running the backward gives other numbers, so
eager PyTorch is an oracle that tells the two apart. Before stored references were seen, the
export inlined their forward and differentiated it: w.grad came out [1, 2, 3] where eager gives
[2, 2, 2], with no warning under any policy."""
import copy
import functools

import pytest
import torch

from torch_ort import ORTModule


class Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, g):
        return 3 * g, 2 * g.sum(0)  # not the derivative: shows this backward ran


class MulSetupContext(torch.autograd.Function):
    @staticmethod
    def forward(x, w):
        return x * w

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return -g, 5 * g.sum(0)


class MulInherited(Mul):
    """Inherits forward; its own backward."""

    @staticmethod
    def backward(ctx, g):
        return 7 * g, -g.sum(0)


ALIAS = Mul.apply  # bound when this module was imported, long before any export


def _direct(fn_cls):
    return lambda self, x, w: fn_cls.apply(x, w)


class Net(torch.nn.Module):
    """forward(x) = sum(tanh(how(x @ A, w))) for one way `how` of reaching a Function."""

    def __init__(self, how: str, fn_cls=Mul):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(4, 3))
        self.w = torch.nn.Parameter(torch.randn(3))
        self.how = how
        if how == "stored":
            self.fn = fn_cls.apply
        elif how == "partial":
            self.fn = functools.partial(fn_cls.apply)
        elif how == "lambda":
            self.fn = lambda x, w: fn_cls.apply(x, w)
        elif how == "alias":
            self.fn = ALIAS
        else:
            self.fn = None
        self.fn_cls = fn_cls

    def forward(self, x):
        h = x @ self.a
        y = self.fn_cls.apply(h, self.w) if self.fn is None else self.fn(h, self.w)
        return torch.tanh(y).sum()


WAYS = [("direct", Mul), ("stored", Mul), ("partial", Mul), ("lambda", Mul), ("alias", Mul),
        ("stored", MulSetupContext), ("direct", MulSetupContext), ("stored", MulInherited),
        ("direct", MulInherited)]


@pytest.mark.parametrize("how, fn_cls", WAYS, ids=[f"{h}-{c.__name__}" for h, c in WAYS])
def test_the_functions_own_backward_runs_however_apply_is_reached(how, fn_cls):
    eager = Net(how, fn_cls)
    ours = ORTModule(copy.deepcopy(eager))
    for step in range(2):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
        for model in (eager, ours):
            model.zero_grad()
            model(x).backward()
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    engine = ours._last_engine
    assert engine.stats()["num_forward_nodes"] > 0
    assert ours._plan_cache and all(r.export.python_ops for r in ours._plan_cache.runners())


def test_the_wrapped_forwards_are_restored_after_the_export():
    before = {cls: cls.__dict__["forward"] for cls in (Mul, MulSetupContext, MulInherited) if "forward" in cls.__dict__}
    ours = ORTModule(Net("stored"))
    ours(torch.randn(5, 4)).backward()
    after = {cls: cls.__dict__["forward"] for cls in before}
    assert after == before
    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    Mul.apply(x, w).sum().backward()  # eager use after the export: the Function's own backward
    torch.testing.assert_close(x.grad, torch.full((2, 3), 3.0))
