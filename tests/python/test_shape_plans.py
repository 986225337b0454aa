"""Exports that do not hold for every size of a symbolic dim export again with fewer dynamic dims
(shape_plans.SHAPE_PLANS: every dim dynamic, then size-1 dims static, then every dim static); the
graph records the sizes it fixed, and a call with other sizes exports again instead of running a
graph specialised to sizes it does not have."""
import copy

import pytest
import torch

from torch_ort import ORTModule
from torch_ort.ortmodule.export import exporter
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export


class SqueezeConv(torch.nn.Module):
    """x: (B, 1, C, H, W); squeeze(1) must drop the size-1 dim before conv2d."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x.squeeze(1)).relu().mean((2, 3))


class SqueezeScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        return (x.squeeze(1) * self.w).sum(-1)


def plan_of(ours):
    return [r.export.shape_plan for r in ours._plan_cache.runners()]


def check_step(eager, ours, x):
    out_e, out_o = eager(x), ours(x)
    torch.testing.assert_close(out_o, out_e)
    out_e.square().sum().backward()
    out_o.square().sum().backward()
    for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_o.grad, p_e.grad, msg=name)
        p_e.grad = p_o.grad = None


def test_squeeze_of_a_size_one_dim_exports_with_that_dim_static(strict):
    """(Every dim symbolic, the exporter kept the squeezed dim and conv2d got a 5-D input.)"""
    torch.manual_seed(0)
    eager = SqueezeConv()
    ours = ORTModule(copy.deepcopy(eager))
    for batch in (2, 5, 3):  # the batch dim stays symbolic: one export serves every batch size
        check_step(eager, ours, torch.randn(batch, 1, 3, 8, 8))
    assert plan_of(ours) == ["size-1 dims static"]
    assert ours.export_count == 1 and ours.engine_build_count == 1


def test_a_call_with_other_sizes_exports_again_never_runs_a_wrong_specialisation(strict):
    torch.manual_seed(0)
    eager = SqueezeScale()
    ours = ORTModule(copy.deepcopy(eager))
    check_step(eager, ours, torch.randn(2, 1, 5))
    # Every dim symbolic, the export declares squeeze(1) a no-op while its Squeeze is not: the
    # engine's shape inference refuses that graph, and the export is made again.
    assert plan_of(ours) == ["size-1 dims static"] and ours.export_count == 2
    check_step(eager, ours, torch.randn(4, 1, 5))
    assert ours.export_count == 2
    # dim 1 of size 2: eager's squeeze(1) leaves it alone; the graph above squeezes it
    check_step(eager, ours, torch.randn(3, 2, 5))
    assert ours.export_count == 3


def test_squeeze_of_a_dim_of_another_size_is_a_no_op_as_in_eager(strict):
    model = ORTModule(SqueezeScale())
    x = torch.randn(3, 2, 5)  # exported with this size first: the stock Squeeze would fail here
    torch.testing.assert_close(model(x), SqueezeScale.forward(model.module, x))


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x).sum()


def test_plans_progress_and_stop_at_every_dim_static(strict, monkeypatch):
    """An export that fails whenever a dim is dynamic succeeds with every dim static; the graph
    then fixes every size and a new size exports again from that plan."""
    real = exporter._export_once
    tried = []

    def fussy(module, args, kwargs, opset, table, capture, static):
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        tried.append(sum(len(static.get(id(t), ())) for t in tensors))
        if any(len(static.get(id(t), ())) < t.dim() for t in tensors):
            raise ValueError("Cannot view a tensor with shape [s0, s1] (stand-in failure)")
        return real(module, args, kwargs, opset, table, capture, static)

    monkeypatch.setattr(exporter, "_export_once", fussy)
    ours = ORTModule(Plain())
    ours(torch.randn(1, 4)).backward()
    assert tried == [0, 1, 2]  # dynamic, size-1 dims static, every dim static
    assert plan_of(ours) == ["static"]
    assert next(iter(ours._plan_cache.runners())).export.static_dims == [[1, 4]]
    tried.clear()
    ours(torch.randn(3, 4))
    assert tried == [2] and ours.export_count == 2  # straight to the plan that worked


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            return h.sum()
        return -h.sum()


def test_failures_fewer_dynamic_dims_cannot_fix_are_not_retried(strict, monkeypatch):
    real = exporter._export_once
    calls = []
    monkeypatch.setattr(exporter, "_export_once", lambda *a: calls.append(1) or real(*a))
    with pytest.raises(ORTModuleTorchModelException, match="data-dependent|Python control flow"):
        ORTModule(DataDependent())(torch.randn(1, 4))
    assert len(calls) == 1


class LastStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        return x.unbind(1)[-1] * self.w


def test_a_dim_the_trace_pinned_to_one_size_is_checked_at_every_call(strict):
    """unbind(1)[-1] resolves -1 for the traced size: torch.export pins that dim's range to one
    size while the graph's input shape stays symbolic. The pinned size is recorded, so another
    size exports again (it silently returned the wrong step)."""
    torch.manual_seed(0)
    eager = LastStep()
    ours = ORTModule(copy.deepcopy(eager))
    for steps in (5, 7, 5):
        check_step(eager, ours, torch.randn(2, steps, 3))
    assert next(iter(ours._plan_cache.runners())).export.static_dims == [[None, 5, 3]]
