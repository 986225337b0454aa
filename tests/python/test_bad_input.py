"""Bad input gets a clear error (FALLBACK_DISABLE) or one warning and correct eager training."""
import warnings

import pytest
import torch

from conftest import twin
from torch_ort import ORTModule
from torch_ort import _C
from torch_ort.ortmodule import ORTModuleIOError, ORTModuleONNXModelException, ORTModuleTorchModelException

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export


class WithPixelShuffle(torch.nn.Module):  # DepthToSpace: no kernel in the engine -> an ATen node
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.pixel_shuffle(self.fc(x).reshape(-1, 4, 1, 1), 2).pow(2).mean()


class WithAbs(torch.nn.Module):  # Abs: a kernel, but no gradient rule -> runs as an ATen node
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.abs(self.fc(x)).mean()


class DataDependentBranch(torch.nn.Module):  # control flow on a value: torch.export cannot trace it
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h.pow(2).mean() if h.sum() > 0 else h.mean()


class ListReturningOp(torch.nn.Module):  # split_copy: no translation, and returns Tensor[], which
    def __init__(self):                  # an ATen node cannot carry (its outputs are tensors)
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.split_copy(self.fc(x), 2)[0].pow(2).mean()


class ComplexInput(torch.nn.Module):  # a complex input: a dtype the engine does not take
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, z):
        return self.fc(z.real).pow(2).mean()


def test_malformed_onnx_bytes():
    with pytest.raises(_C.OnnxImportError, match="ModelProto"):
        _C.Engine(b"\x08\x01garbage-not-onnx", True, [])


@pytest.mark.parametrize("model_cls, what", [
    (DataDependentBranch, "torch.export"),
    (ListReturningOp, r"aten::split_copy.Tensor: it returns List\[Tensor\]"),
])
def test_unsupported_model_raises_with_fallback_disabled(strict, model_cls, what):
    with pytest.raises(ORTModuleTorchModelException, match=what):
        ORTModule(model_cls())(torch.randn(3, 4)).backward()


@pytest.mark.parametrize("model_cls, what", [(WithPixelShuffle, "DepthToSpace"), (WithAbs, "Abs")])
def test_unsupported_op_raises_without_aten_fallback(strict, monkeypatch, model_cls, what):
    monkeypatch.setenv("ORTMODULE_ATEN_FALLBACK", "0")
    with pytest.raises(ORTModuleONNXModelException, match=what) as info:
        ORTModule(model_cls())(torch.randn(3, 4)).backward()
    assert "node" in str(info.value)


@pytest.mark.parametrize("model_cls", [WithPixelShuffle, WithAbs])
def test_ops_without_kernel_or_rule_train_via_aten_fallback(strict, model_cls):
    """What once failed here (no kernel, no gradient rule) now runs in our graph as ATen nodes."""
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: nothing runs in eager
        for n in (3, 5, 4):
            x = torch.randn(n, 4, generator=gen)
            for m in (eager, ours):
                m.zero_grad()
                m(x).backward()
            torch.testing.assert_close(ours(x), eager(x), rtol=1e-5, atol=1e-6)
            for pe, po in zip(eager.parameters(), ours.parameters()):
                torch.testing.assert_close(po.grad, pe.grad, rtol=1e-4, atol=1e-6)


def test_complex_input_raises_with_fallback_disabled(strict):
    with pytest.raises(ORTModuleIOError, match="complex"):
        ORTModule(ComplexInput())(torch.randn(3, 4, dtype=torch.cfloat))


@pytest.mark.fallback
@pytest.mark.parametrize("model_cls, make_input", [
    (DataDependentBranch, lambda g: torch.randn(3, 4, generator=g)),
    (ListReturningOp, lambda g: torch.randn(3, 4, generator=g)),
    (ComplexInput, lambda g: torch.randn(3, 4, dtype=torch.cfloat, generator=g)),
])
def test_default_policy_warns_once_and_trains_in_eager(model_cls, make_input):
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            x = make_input(gen)
            for m, opt in ((eager, opt_e), (ours, opt_o)):
                opt.zero_grad()
                loss = m(x)
                loss.backward()
                opt.step()
            torch.testing.assert_close(ours(x), eager(x))
    ours_warnings = [w for w in caught if "torch_ort" in str(w.message)]
    assert len(ours_warnings) == 1, [str(w.message) for w in ours_warnings]
    assert "falling back" in str(ours_warnings[0].message)


def test_engine_rejects_wrong_dtype():
    """The engine itself checks each input against the graph it was built for."""
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    engine = _C.Engine(model.SerializeToString(), False, [False])
    torch.testing.assert_close(engine.forward([torch.tensor([[-1.0, 2.0, 0.5]])])[0][0],
                               torch.tensor([[0.0, 2.0, 0.5]]))
    with pytest.raises(TypeError, match="'x'.*float"):
        engine.forward([torch.ones(2, 3, dtype=torch.float64)])
