"""Symbolic shape inference on exported models: every value of the training graph gets a known
rank, and every inferred dim agrees with the tensors a real run produces (Engine.check_shapes,
which binds each symbol to the first size it meets). Plus the engine's contradiction check."""
import math

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from conftest import MLPClassifier, classifier_batch
from torch_ort import _C
from torch_ort.ortmodule.export.exporter import export_module


class TinyBlock(torch.nn.Module):
    """A pre-norm transformer block written by hand with ops the engine runs: hand-rolled layer
    norm, two-head attention through view/transpose (the exporter's Shape->Concat->Reshape
    chains), a tanh MLP, residuals and an MSE loss."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))
        self.proj = torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.gain = torch.nn.Parameter(torch.ones(d))

    def norm(self, x):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * self.gain

    def forward(self, x, target):
        b, t, c = x.shape
        h = self.norm(x)
        q, k, v = (m(h).view(b, t, self.heads, c // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        x = x + self.out(torch.tanh(self.fc(self.norm(x))))
        return F.mse_loss(x, target), x


def block_batch(b, t, d=16):
    return torch.randn(b, t, d), torch.randn(b, t, d)


MODELS = {"mlp": (MLPClassifier, lambda n: classifier_batch(n), [(6,), (3,)]),
          "block": (TinyBlock, lambda b, t: block_batch(b, t), [(2, 5), (3, 7)])}


def without_exporter_shapes(onnx_bytes):
    """The model with every intermediate and output shape removed: inference starts from the
    input shapes alone."""
    model = onnx.load_from_string(onnx_bytes)
    del model.graph.value_info[:]
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    return model.SerializeToString()


@pytest.fixture(scope="module", params=[(m, s) for m in sorted(MODELS) for s in ("exported", "stripped")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request):
    name, variant = request.param
    cls, batch, sizes = MODELS[name]
    torch.manual_seed(0)
    model = cls()
    result = export_module(model, batch(*sizes[0]), {}, None)
    onnx_bytes = result.onnx_bytes if variant == "exported" else without_exporter_shapes(result.onnx_bytes)
    named = dict(model.named_parameters())
    params = [named[n].detach() for n in result.param_names]
    return f"{name} ({variant} shapes)", (onnx_bytes, len(result.input_names)), params, batch, sizes


def engine(result, params, training):
    onnx_bytes, n_user = result
    return _C.Engine(onnx_bytes, training, [False] * n_user + [True] * len(params))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_every_value_has_a_known_rank(exported, training):
    name, result, params, _, _ = exported
    shapes = engine(result, params, training).value_shapes()
    unknown = [v for v, s in shapes if s == "[?]"]
    named = [v for v, s in shapes if s != "[?]" and "?" not in s]
    print(f"\n{name} {'training' if training else 'inference'} graph: {len(shapes) - len(unknown)}/{len(shapes)} "
          f"values of known rank, {len(named)}/{len(shapes)} with every dim a size or a symbol")
    assert not unknown, f"values of unknown rank: {unknown}"
    assert len(named) == len(shapes), [(v, s) for v, s in shapes if "?" in s]


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_inferred_dims_agree_with_the_tensors_of_a_run(exported, training):
    name, result, params, batch, sizes = exported
    e = engine(result, params, training)
    for size in sizes:  # one engine, several sizes: the symbols rebind per run
        rows = e.check_shapes([*batch(*size), *params])
        assert rows and all(r["rank_known"] for r in rows)
        unchecked = [(r["name"], r["inferred"]) for r in rows if r["unchecked_dims"]]
        assert not unchecked, f"{name}: dims with nothing to compare: {unchecked}"
        if training:
            # backward values were checked too, not just forward ones
            assert any(r["name"].endswith("_grad/accumulated") or "_grad/" in r["name"] for r in rows)


def test_check_shapes_leaves_the_engine_usable(exported):
    _, result, params, batch, sizes = exported
    e = engine(result, params, True)
    e.check_shapes([*batch(*sizes[0]), *params])
    (loss, _), ctx = e.forward([*batch(*sizes[1]), *params])
    grads = e.backward(ctx, [torch.tensor(1.0), None])
    assert torch.isfinite(loss) and all(g is not None for g in grads[result[1]:])


def test_exported_block_trains_with_eager_gradients():
    # Without inference the exporter's unshaped MatMul inputs stop autodiff ("the gradient needs
    # the rank of 'val_59'"); with it the block trains, and its gradients are eager's.
    torch.manual_seed(0)
    model = TinyBlock()
    x, target = block_batch(3, 7)
    result = export_module(model, (x, target), {}, None)
    named = dict(model.named_parameters())
    params = [named[n] for n in result.param_names]
    e = _C.Engine(result.onnx_bytes, True, [False, False] + [True] * len(params))
    (loss, _), ctx = e.forward([x, target, *[p.detach() for p in params]])
    grads = e.backward(ctx, [torch.tensor(1.0), None])[2:]
    ref_loss, _ = model(x, target)
    ref = torch.autograd.grad(ref_loss, params)
    torch.testing.assert_close(loss, ref_loss.detach())
    for name, g, r in zip(result.param_names, grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


# --- hand-written graphs: the engine's own checks
def relu_model(y_shape):
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="/act/Relu")], "relu",
                              [vi("x", TensorProto.FLOAT, ["batch", 3])], [vi("y", TensorProto.FLOAT, y_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10).SerializeToString()


def test_exporter_shape_contradicting_the_op_fails_the_build_naming_the_node():
    with pytest.raises(_C.VerifyError, match=r"'y'.*Relu \(node /act/Relu\).*\[batch,5\].*\[batch,3\]"):
        _C.Engine(relu_model(["batch", 5]), False, [False])


def test_run_time_disagreement_names_the_value():
    # [3, batch] is not provably wrong for Relu([batch, 3]) (batch might be 3), but a run with
    # batch = 4 shows it is.
    e = _C.Engine(relu_model([3, "batch"]), False, [False])
    assert dict(e.value_shapes()) == {"x": "[batch,3]", "y": "[3,batch]"}
    e.check_shapes([torch.randn(3, 3)])
    with pytest.raises(_C.VerifyError, match=r"value 'y' \(produced by Relu \(node /act/Relu\)\) was inferred "
                                             r"\[3,batch\] \(with batch=4\), but the run produced \[4,3\]"):
        e.check_shapes([torch.randn(4, 3)])


def test_exporter_left_shapes_out_inference_fills_them():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/mm"),
             helper.make_node("Reshape", ["h", "target"], ["flat"], name="/flat"),
             helper.make_node("ReduceSum", ["flat"], ["loss"], name="/sum", keepdims=0)]
    target = helper.make_tensor("target", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["batch", "seq", 4]), vi("w", TensorProto.FLOAT, [4, 2])],
                              [vi("loss", TensorProto.FLOAT, None)], initializer=[target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10).SerializeToString()
    e = _C.Engine(model, True, [False, True])
    shapes = dict(e.value_shapes())
    assert shapes["h"] == "[batch,seq,2]" and shapes["flat"] == "[2*batch*seq]" and shapes["loss"] == "[]"
    assert all(s != "[?]" for s in shapes.values()), shapes
    rows = e.check_shapes([torch.randn(2, 5, 4), torch.randn(4, 2)])
    assert {r["name"]: r["actual"] for r in rows}["flat"] == [20]


def test_every_kernel_has_a_shape_rule():
    missing = sorted(set(_C.kernel_ops()) - set(_C.shape_ops()))
    assert not missing, (f"kernels without a shape rule: {missing}; add REGISTER_SHAPE_RULE lines in "
                         "csrc/core/ops/<family>.cc (an op without one infers as unknown, never an error)")
