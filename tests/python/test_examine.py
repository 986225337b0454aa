"""torch_ort.examine: what runs where before training, with nothing of the model changed."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_ort
from torch_ort import ORTModule

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Block(torch.nn.Module):
    """Runs in the engine: a custom Function (PythonOp) and BatchNorm (buffers the forward updates)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(Double.apply(torch.relu(self.norm(self.fc1(x)))))


class Head(torch.nn.Module):
    """Branches on a tensor's value: torch.export cannot capture it."""

    def __init__(self):
        super().__init__()
        self.pos, self.neg = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.pos(x) if x.sum() > 0 else self.neg(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = Block(), Head()

    def forward(self, x):
        return torch.nn.functional.dropout(self.head(self.block(x)), 0.1).sum()


def _snapshot(model):
    return copy.deepcopy(model.state_dict()), torch.get_rng_state()


def _unchanged(model, snapshot):
    state, rng = snapshot
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.fallback  # what the default policy would run where
def test_names_each_part_of_a_split_model():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(6, 8)
    before = _snapshot(model)
    report = torch_ort.examine(model, x)
    _unchanged(model, before)  # parameters, running statistics and the RNG as they were
    assert report.training and report.runs == "split"
    parts = {p.name: p for p in report.parts}
    assert set(parts) == {"", "block", "head"}
    assert "data-dependent" in parts[""].reason.lower() or "DataDependent" in parts[""].reason
    assert parts["block"].runs == "engine" and parts["block"].predicted_peak > 0
    assert parts["head"].runs == "eager" and parts["head"].reason
    assert report.python_ops == [f"{Double.__module__}.{Double.__qualname__}"]
    share = sum(p.numel() for p in model.block.parameters()) / sum(p.numel() for p in model.parameters())
    assert report.engine_parameter_share == pytest.approx(share)
    flops = {"block": 2 * 6 * 8 * 16 * 2, "head": 2 * 6 * 8 * 4}  # the Linear layers' products
    assert report.engine_flop_share == pytest.approx(flops["block"] / sum(flops.values()))
    assert report.kernels and not any("ATenOp" in op or "PythonOp" in op for op in report.kernels)
    text = str(report)
    for needle in ("block: engine", "head: eager PyTorch", "PythonOp: ", "ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS",
                   "branches on a tensor's value"):
        assert needle in text, (needle, text)
    # The model trains afterwards as if never examined.
    loss = ORTModule(model)(x)
    loss.backward()
    assert model.block.fc1.weight.grad is not None


def test_whole_model_in_the_engine_runs_nothing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    wrapped = ORTModule(model)
    x = torch.randn(5, 8)
    before = _snapshot(model)
    report = torch_ort.examine(wrapped, x)
    _unchanged(model, before)
    assert wrapped.export_count == 0  # examined through a wrapper of its own
    assert report.runs == "engine" and [p.name for p in report.parts] == [""]
    assert report.engine_parameter_share == 1.0 and report.engine_flop_share == 1.0
    assert not report.aten_fallback and not report.python_ops
    assert report.predicted_peak is not None and report.predicted_peak > 0
    assert sum(report.kernels.values()) >= 3 and report.export_seconds > 0 and report.build_seconds > 0
    assert "predicted step peak" in str(report)
    model.eval()
    with torch.no_grad():
        inference = torch_ort.examine(model, x)
    assert not inference.training and inference.predicted_peak is None and inference.runs == "engine"


def test_aten_fallback_ops_are_named():
    class Shuffle(torch.nn.Module):  # pixel_shuffle exports as DepthToSpace, which has no kernel
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 16, 3, padding=1)

        def forward(self, x):
            return F.pixel_shuffle(self.conv(x), 2).sum()

    report = torch_ort.examine(Shuffle(), torch.randn(1, 4, 6, 6))
    assert report.runs == "engine" and report.aten_fallback
    assert any("pixel_shuffle" in op for op in report.aten_fallback), report.aten_fallback
    assert "ATen fallback: " in str(report)


def test_under_fallback_disable_it_says_training_raises():
    # The suite's default policy is FALLBACK_DISABLE: training would raise, and examine says so
    # instead of raising or pretending a split.
    report = torch_ort.examine(Model(), torch.randn(6, 8))
    assert report.runs == "eager" and [p.name for p in report.parts] == [""]
    assert any("training raises" in a for a in report.advice), report.advice
    assert report.engine_parameter_share == 0.0 and report.engine_flop_share == 0.0
