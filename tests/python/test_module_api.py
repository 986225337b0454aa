"""ORTModule as an nn.Module: state_dict/parameters of the original, nested inputs and outputs,
re-export only on a schema change, save_onnx files, and the saved-set log line."""
import glob
import os

import onnx
import pytest
import torch

import torch_ort
from conftest import MLPClassifier, classifier_batch, twin
from torch_ort import DebugOptions, LogLevel, ORTModule
from torch_ort.ortmodule import ORTModuleTorchModelException


def test_module_surface_is_the_original():
    inner = MLPClassifier()
    ours = ORTModule(inner)
    assert ours.module is inner
    assert list(ours.state_dict()) == list(inner.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in inner.named_parameters()]
    assert all(a is b for a, b in zip(ours.parameters(), inner.parameters()))
    assert ours.fc1 is inner.fc1  # attribute access reaches the wrapped module
    other = MLPClassifier()
    ours.load_state_dict(other.state_dict())
    torch.testing.assert_close(inner.fc1.weight, other.fc1.weight)
    ours.eval()
    assert not inner.training
    ours.train()
    assert inner.training


def test_rejects_dataparallel(strict):
    with pytest.raises(ORTModuleTorchModelException, match="DataParallel"):
        ORTModule(torch.nn.DataParallel(MLPClassifier()))


def test_registering_on_the_wrapper_registers_on_the_module(strict):
    """A buffer, parameter or submodule registered on the ORTModule itself lands in the wrapped
    module (it vanished from named_buffers() and state_dict()), and the next call re-exports."""
    torch.manual_seed(0)
    ours = ORTModule(MLPClassifier())
    x, labels = torch.randn(4, 12), torch.randint(0, 5, (4,))
    ours(x, labels)
    ours.register_buffer("steps", torch.zeros(()))
    ours.register_parameter("temperature", torch.nn.Parameter(torch.ones(())))
    ours.register_module("extra", torch.nn.Linear(2, 2))
    assert "steps" in dict(ours.named_buffers()) and "steps" in ours.state_dict()
    assert "temperature" in dict(ours.named_parameters()) and "extra.weight" in ours.state_dict()
    assert ours.module.steps is ours.steps and ours.module.extra is ours.extra
    assert not ours._buffers and not ours._parameters
    ours(x, labels)
    assert ours.export_count == 2



class WithMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.scaled(self.fc(x))

    def scaled(self, y):
        return y * 2

    def echo(self, value):
        return value


def _sum_three(self, a, b, c):
    return a + b + c


def test_assignment_on_the_wrapper_is_ortmodules(strict):
    """As ORTModule: a method the wrapped module's class defines, reassigned on the wrapper, is
    replaced on the wrapper only (the wrapped module keeps its own); any other attribute lands on
    the wrapped module, and ORTModule's own attributes stay on the wrapper."""
    torch.manual_seed(0)
    inner = WithMethod()
    ours = ORTModule(inner)
    x = torch.randn(2, 4)
    assert ours.echo(x) is x  # reached through the wrapper, bound like the module's
    expected = inner(x)
    ours.echo = _sum_three
    assert ours.echo is _sum_three and "echo" in ours.__dict__
    assert inner.echo is not _sum_three and inner.echo(x) is x
    assert type(inner).echo is WithMethod.echo and "echo" not in inner.__dict__
    ours.new_flag = "lambda x: x"
    assert inner.new_flag == "lambda x: x" and "new_flag" not in ours.__dict__
    ours.scale = torch.nn.Parameter(torch.ones(()))
    assert inner.scale is ours.scale and "scale" not in ours.__dict__
    ours.export_count_seen = ours.export_count  # a new name: the wrapped module's
    assert hasattr(inner, "export_count_seen")
    ours._settings = ours._settings  # ORTModule's own: stays on the wrapper
    assert not hasattr(inner, "_settings")
    torch.testing.assert_close(ours(x), expected)  # forward still calls the module's own method


class Nested(torch.nn.Module):
    """Takes a dict and a list, returns a dict holding a tuple."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 3)

    def forward(self, inputs, extra, scale=1.0, use_b=True):
        x = inputs["x"]
        y = self.a(x) * scale
        if use_b:
            y = y + self.b(extra[0]) - extra[1]
        return {"out": (y, torch.tanh(y)), "sum": y.sum()}


def test_nested_inputs_outputs_and_schema(strict):
    eager, wrapped = twin(Nested)
    ours = ORTModule(wrapped)

    def call(m, n, **kw):
        g = torch.Generator().manual_seed(n)
        x, e0, e1 = (torch.randn(n, 4, generator=g) for _ in range(3))
        return m({"x": x}, [e0, e1[:, :3]], **kw)

    for n in (5, 8, 3):
        out_o, out_e = call(ours, n), call(eager, n)
        assert set(out_o) == {"out", "sum"} and isinstance(out_o["out"], tuple)
        torch.testing.assert_close(out_o["out"][1], out_e["out"][1])
        (out_o["out"][1].sum() + out_o["sum"]).backward()
        (out_e["out"][1].sum() + out_e["sum"]).backward()
    assert ours.export_count == 1
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)

    # Non-tensor arguments are part of the schema: a new value re-exports, the same one does not.
    torch.testing.assert_close(call(ours, 5, use_b=False)["sum"], call(eager, 5, use_b=False)["sum"])
    assert ours.export_count == 2
    torch.testing.assert_close(call(ours, 6, scale=2.0)["sum"], call(eager, 6, scale=2.0)["sum"])
    assert ours.export_count == 3
    call(ours, 7, scale=2.0)
    assert ours.export_count == 3


def test_save_onnx_writes_checkable_graphs(strict, tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    ours = ORTModule(MLPClassifier(), DebugOptions(save_onnx=True, onnx_prefix="mlp"))
    ours(*classifier_batch(4))[0].backward()
    files = sorted(os.path.basename(f) for f in glob.glob(str(tmp_path / "*.onnx")))
    assert files == ["mlp_execution_model_training.onnx", "mlp_optimized_pre_grad_training.onnx",
                     "mlp_torch_exported_training.onnx"]
    for f in files:
        onnx.checker.check_model(onnx.load(str(tmp_path / f)))
    training = onnx.load(str(tmp_path / "mlp_execution_model_training.onnx"))
    ops = [n.op_type for n in training.graph.node]
    assert "SoftmaxCrossEntropyLossGrad" in ops and "ReluGrad" in ops and "TanhGrad" in ops
    outputs = [o.name for o in training.graph.output]
    assert any("fc1.weight" in o for o in outputs[2:]), outputs  # gradients follow the outputs
    assert ops.count("Gemm") > 3  # forward Gemms plus the backward ones


def test_save_onnx_needs_prefix():
    with pytest.raises(ValueError, match="onnx_prefix"):
        DebugOptions(save_onnx=True)


def test_info_log_reports_saved_set(strict, caplog):
    ours = ORTModule(MLPClassifier(), DebugOptions(log_level=LogLevel.INFO))
    ours(*classifier_batch(4))[0].backward()  # torch_ort's records propagate to caplog's handler
    line = next(r.getMessage() for r in caplog.records if "saved set" in r.getMessage())
    saved, total = (int(v) for v in line.split("saved set: ")[1].split(" forward")[0].split(" of "))
    assert 0 < saved < total, line


def test_log_level_env_overrides_debug_options(monkeypatch):
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "ERROR")
    assert DebugOptions(log_level=LogLevel.INFO).log_level == LogLevel.ERROR
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="VERBOSE, DEVINFO, INFO, WARNING, ERROR, FATAL"):
        DebugOptions()


def test_state_dict_round_trip_when_ortmodule_is_a_child():
    """DDP(ORTModule(m)) and a parent model holding an ORTModule save the original's keys under
    the child's name, and load them back (the parent's walk goes through _modules)."""
    class Parent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch_ort.ORTModule(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)))
            self.head = torch.nn.Linear(4, 2)

    torch.manual_seed(0)
    a = Parent()
    torch.manual_seed(1)
    b = Parent()
    state = a.state_dict()
    assert list(state)[:3] == ["body.0.weight", "body.0.bias", "body.1.weight"]
    b.load_state_dict(state)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    with pytest.raises(RuntimeError, match="Unexpected key"):
        b.load_state_dict({**state, "body.extra": torch.zeros(1)})
    # the wrapped modules' versions are found under the names the parent's walk uses
    assert state._metadata["body._original_module.1"] == state._metadata["body.1"]
    assert state._metadata["body.1"]["version"] == torch.nn.BatchNorm1d._version


def test_repr_shows_the_wrapped_module_without_the_wrapper_attribute():
    inner = torch.nn.Linear(4, 3)
    assert repr(ORTModule(inner)) == f"ORTModule(\n  {inner!r}\n)"
    nested = MLPClassifier()
    text = repr(ORTModule(nested))
    assert "_original_module" not in text
    assert text.splitlines()[1:-1] == ["  " + line for line in repr(nested).splitlines()]
    parent = torch.nn.Sequential(ORTModule(torch.nn.Linear(2, 2)))  # inside a parent, indented
    assert "(0): ORTModule(\n    Linear(in_features=2, out_features=2, bias=True)\n  )" in repr(parent)


def test_package_is_typed():
    """PEP 561: torch_ort ships py.typed (pyproject's package-data), and ORTModule's public
    methods carry type hints."""
    import inspect
    import pathlib
    import tomllib

    root = pathlib.Path(torch_ort.__file__).parent
    assert (root / "py.typed").is_file()
    meta = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["torch_ort"]
    public = ["__init__", "state_dict", "load_state_dict", "register_buffer", "register_parameter",
              "add_module", "named_parameters", "named_buffers", "named_modules", "stats",
              "export_onnx", "memory_report", "_forward_call"]
    for name in public:
        sig = inspect.signature(getattr(ORTModule, name))
        assert name == "__init__" or sig.return_annotation is not inspect.Signature.empty, name
        untyped = [p.name for p in sig.parameters.values() if p.name != "self"
                   and p.annotation is inspect.Parameter.empty]
        assert not untyped, f"ORTModule.{name}: {untyped} have no type hint"
    for prop in ("module", "fallback"):
        assert "return" in getattr(ORTModule, prop).fget.__annotations__, prop


class Shuffled(torch.nn.Module):
    """pixel_shuffle has no kernel of ours: one operator through the ATen fallback."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)

    def forward(self, x):
        return torch.nn.functional.pixel_shuffle(self.fc(x).reshape(-1, 8, 1, 1), 2).pow(2).mean()


def test_stats_report_times_op_counts_and_routed_operators(strict):
    ours = ORTModule(Shuffled())
    before = ours.stats()
    assert before["export_seconds"] == before["build_seconds"] == 0.0 and before["op_counts"] == {}
    ours(torch.randn(3, 6)).backward()
    st = ours.stats()
    assert st["export_seconds"] > 0 and st["build_seconds"] > 0
    counts = st["op_counts"]
    assert counts["com.torch_ort::ATenOp"] == 1 and counts["com.torch_ort::ATenOpGrad"] == 1
    assert all(isinstance(k, str) and v > 0 for k, v in counts.items())
    assert st["aten_fallback_ops"] == ["aten::pixel_shuffle.default"]
