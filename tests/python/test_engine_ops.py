"""Kernel parity: one table row per op case, each run as a single-node ONNX model through
torch_ort._C.Engine (inference) and compared with an eager PyTorch reference. Plus the engine's
error contract (bad inputs, unsupported ops, bad bytes) and run-context rules."""
import dataclasses
from typing import Callable

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from torch_ort import _C

OURS = "com.torch_ort"
ONNX_TYPE = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE,
             torch.float16: TensorProto.FLOAT16, torch.int64: TensorProto.INT64,
             torch.int32: TensorProto.INT32, torch.bool: TensorProto.BOOL}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-7, atol=1e-9),
       torch.float16: dict(rtol=1e-3, atol=1e-3)}

_gen = torch.Generator().manual_seed(0)


def f(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen, dtype=dtype)


def pos(*shape):  # strictly positive (Sqrt, Log, Pow bases)
    return torch.rand(*shape, generator=_gen) + 0.5


def i64(*v):
    return torch.tensor(v, dtype=torch.int64)


def labels(*shape, classes):
    return torch.randint(0, classes, shape, generator=_gen)


@dataclasses.dataclass
class Case:
    op: str
    inputs: list                        # tensors; None = omitted optional input
    ref: Callable                       # eager reference: (*inputs) -> tensor or tuple
    attrs: dict = dataclasses.field(default_factory=dict)
    domain: str = ""
    opset: int = 20
    n_out: int = 1
    consts: tuple = ()                  # input indices baked in as initializers
    seed: int | None = None             # re-seed torch before ref and engine (random ops)
    id: str = ""

    def __post_init__(self):
        self.id = self.id or self.op


def sce_grad(reduction, ignore_index=None):
    def ref(dloss, log_prob, lab, w=None):
        x = log_prob.clone().requires_grad_()  # log_softmax(log_prob) == log_prob
        kw = {} if ignore_index is None else dict(ignore_index=ignore_index)
        loss = F.cross_entropy(x, lab, weight=w, reduction=reduction, **kw)
        return torch.autograd.grad(loss, x, dloss)[0]
    return ref


def nll_grad(reduction):
    def ref(dloss, inp, lab, w=None):
        x = inp.clone().requires_grad_()
        return torch.autograd.grad(F.nll_loss(x, lab, weight=w, reduction=reduction), x, dloss)[0]
    return ref


def lp(*shape):
    return torch.log_softmax(f(*shape), 1)


CASES = [
    Case("Add", [f(2, 3), f(3)], torch.add, id="Add-bcast"),
    Case("Add", [i64(1, 2, 3), i64(5)], torch.add, id="Add-int64"),
    Case("Sub", [f(2, 1, 4), f(3, 1)], torch.sub),
    Case("Mul", [f(2, 3, dtype=torch.float64), f(2, 3, dtype=torch.float64)], torch.mul, id="Mul-f64"),
    Case("Div", [f(4, 3), pos(3)], torch.div),
    Case("Div", [i64(7, -7, 9), i64(2, 2, -4)], lambda a, b: torch.div(a, b, rounding_mode="trunc"), id="Div-int-trunc"),
    Case("Neg", [f(3, 4)], torch.neg),
    Case("Pow", [pos(2, 3), f(3)], torch.pow),
    Case("Pow", [pos(2, 3), i64(2)], lambda x, y: torch.pow(x, y).float(), id="Pow-int-exponent"),
    Case("Sqrt", [pos(5)], torch.sqrt),
    Case("Exp", [f(2, 2)], torch.exp),
    Case("Log", [pos(6)], torch.log),
    Case("Abs", [f(3, 3)], torch.abs),
    Case("Relu", [f(4, 5)], torch.relu),
    Case("Tanh", [f(4, 5)], torch.tanh),
    Case("Sigmoid", [f(4, 5)], torch.sigmoid),
    Case("Sigmoid", [f(4, 5, dtype=torch.float16)], torch.sigmoid, id="Sigmoid-f16"),
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x, -1)),
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x, 1), attrs=dict(axis=1), id="Softmax-axis1"),
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x.reshape(2, 12), 1).reshape(2, 3, 4),
         opset=11, id="Softmax-opset11-coerced"),
    Case("LogSoftmax", [f(3, 5)], lambda x: torch.log_softmax(x, -1)),
    Case("LogSoftmax", [f(2, 3, 4)], lambda x: torch.log_softmax(x, 0), attrs=dict(axis=-3), id="LogSoftmax-neg-axis"),
    Case("MatMul", [f(3, 4), f(4, 2)], torch.matmul),
    Case("MatMul", [f(2, 1, 3, 4), f(5, 4, 2)], torch.matmul, id="MatMul-batched-bcast"),
    Case("MatMul", [f(4), f(2, 4, 3)], torch.matmul, id="MatMul-1d"),
    Case("Gemm", [f(3, 4), f(4, 5), f(5)], lambda a, b, c: a @ b + c),
    Case("Gemm", [f(4, 3), f(5, 4), f(3, 5)], lambda a, b, c: 0.5 * a.T @ b.T + 2.0 * c,
         attrs=dict(transA=1, transB=1, alpha=0.5, beta=2.0), id="Gemm-trans-alpha-beta"),
    Case("Gemm", [f(3, 4), f(4, 5), None], lambda a, b: 3.0 * (a @ b), attrs=dict(alpha=3.0), id="Gemm-noC"),
    Case("Gemm", [f(3, 4), f(4, 5), f(3, 1)], lambda a, b, c: a @ b + c, id="Gemm-C-col"),
    Case("ReduceSum", [f(2, 3, 4), i64(1)], lambda x, a: x.sum(1, keepdim=True)),
    Case("ReduceSum", [f(2, 3, 4), i64(0, -1)], lambda x, a: x.sum((0, 2)), attrs=dict(keepdims=0),
         consts=(1,), id="ReduceSum-const-axes"),
    Case("ReduceSum", [f(2, 3), None], lambda x: x.sum().reshape(1, 1), id="ReduceSum-all"),
    Case("ReduceSum", [f(2, 3), None], lambda x: x, attrs=dict(noop_with_empty_axes=1), id="ReduceSum-noop"),
    Case("ReduceSum", [torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), i64(1)],
         lambda x, a: x.sum(1, keepdim=True, dtype=torch.int32), id="ReduceSum-int32"),
    Case("ReduceMean", [f(2, 3, 4), i64(-1)], lambda x, a: x.mean(-1), attrs=dict(keepdims=0)),
    Case("ReduceMean", [f(2, 3, 4)], lambda x: x.mean((0, 2), keepdim=True), attrs=dict(axes=[0, 2]),
         opset=13, id="ReduceMean-opset13-attr"),
    Case("Reshape", [f(2, 3, 4), i64(0, -1)], lambda x, s: x.reshape(2, 12)),
    Case("Reshape", [f(2, 0, 4), i64(0, 8)], lambda x, s: x.reshape(0, 8), attrs=dict(allowzero=1),
         consts=(1,), id="Reshape-allowzero"),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(2, 12)),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(1, 24), attrs=dict(axis=0), id="Flatten-axis0"),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(6, 4), attrs=dict(axis=-1), id="Flatten-neg"),
    Case("Transpose", [f(2, 3, 4)], lambda x: x.permute(2, 1, 0)),
    Case("Transpose", [f(2, 3, 4)], lambda x: x.permute(1, 0, 2), attrs=dict(perm=[1, 0, 2]), id="Transpose-perm"),
    Case("Identity", [f(3)], lambda x: x),
    Case("Cast", [f(3, 4) * 4], lambda x: x.to(torch.int64), attrs=dict(to=TensorProto.INT64)),
    Case("Cast", [i64(0, 3, -2)], lambda x: x.to(torch.bool), attrs=dict(to=TensorProto.BOOL), id="Cast-bool"),
    Case("Constant", [], lambda: torch.arange(6.0).reshape(2, 3),
         attrs=dict(value=numpy_helper.from_array(torch.arange(6.0).reshape(2, 3).numpy()))),
    Case("Constant", [], lambda: torch.tensor(2.5), attrs=dict(value_float=2.5), id="Constant-float"),
    Case("Constant", [], lambda: i64(1, -1), attrs=dict(value_ints=[1, -1]), id="Constant-ints"),
    Case("Shape", [f(2, 3, 4)], lambda x: i64(2, 3, 4)),
    Case("Shape", [f(2, 3, 4)], lambda x: i64(3), attrs=dict(start=1, end=-1), id="Shape-slice"),
    Case("Size", [f(2, 3, 4)], lambda x: torch.tensor(24)),
    Case("Squeeze", [f(1, 3, 1, 2), i64(0)], lambda x, a: x.squeeze(0)),
    Case("Squeeze", [f(1, 3, 1, 2)], lambda x: x.reshape(3, 2), id="Squeeze-all"),
    Case("Unsqueeze", [f(3, 4), i64(0, -1)], lambda x, a: x.reshape(1, 3, 4, 1)),
    Case("Expand", [f(3, 1), i64(2, 1, 5)], lambda x, s: x.expand(2, 3, 5)),
    Case("Concat", [f(2, 1), f(2, 3), f(2, 2)], lambda *t: torch.cat(t, 1), attrs=dict(axis=1)),
    Case("Concat", [i64(1, 2), i64(3)], lambda *t: torch.cat(t), attrs=dict(axis=0), id="Concat-int64"),
    Case("Sum", [f(2, 3), f(3), f(1, 1)], lambda a, b, c: a + b + c),
    Case("Dropout", [f(3, 4)], lambda x: (x, torch.ones(3, 4, dtype=torch.bool)), n_out=2, id="Dropout-inference"),
    Case("Dropout", [f(50, 40), torch.tensor(0.3), torch.tensor(True)],
         lambda x, r, t: (lambda y: (y, y != 0))(F.dropout(x, 0.3, training=True)), n_out=2, seed=7,
         id="Dropout-training-seeded"),
    Case("Equal", [i64(1, 2, 3), i64(2)], torch.eq),
    Case("Greater", [f(2, 3), f(3)], torch.gt),
    Case("Less", [f(2, 3), f(2, 1)], torch.lt),
    Case("Where", [f(2, 3) > 0, f(2, 3), f(3)], torch.where),
    Case("Not", [f(5) > 0], torch.logical_not),
    Case("ConstantOfShape", [i64(2, 3)], lambda s: torch.zeros(2, 3)),
    Case("ConstantOfShape", [i64(4)], lambda s: torch.full((4,), 7, dtype=torch.int64),
         attrs=dict(value=numpy_helper.from_array(i64(7).numpy())), id="ConstantOfShape-int64"),
    Case("Gather", [f(5, 3), torch.tensor([[0, -1], [2, 4]])], lambda d, i: d[i % 5]),
    Case("Gather", [f(2, 5), i64(3, 0)], lambda d, i: d[:, [3, 0]], attrs=dict(axis=1), id="Gather-axis1"),
    Case("Gather", [f(4, 3), torch.tensor(2)], lambda d, i: d[2], id="Gather-scalar-index"),
    Case("SoftmaxCrossEntropyLoss", [f(6, 5), labels(6, classes=5)],
         lambda x, y: (F.cross_entropy(x, y), torch.log_softmax(x, 1)), n_out=2),
    Case("SoftmaxCrossEntropyLoss", [f(3, 4, 2, 2), labels(3, 2, 2, classes=4), pos(4)],
         lambda x, y, w: F.cross_entropy(x, y, weight=w, reduction="sum"), attrs=dict(reduction="sum"),
         id="SCE-4d-weights-sum"),
    Case("SoftmaxCrossEntropyLoss", [f(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3)],
         lambda x, y: F.cross_entropy(x, y, reduction="none", ignore_index=1),
         attrs=dict(reduction="none", ignore_index=1), id="SCE-3d-ignore-none"),
    Case("NegativeLogLikelihoodLoss", [lp(6, 5), labels(6, classes=5)], F.nll_loss),
    Case("NegativeLogLikelihoodLoss", [lp(2, 3, 4), torch.tensor([[0, 2, 1, 2], [1, 1, 0, 2]]), pos(3)],
         lambda x, y, w: F.nll_loss(x, y, weight=w, ignore_index=2), attrs=dict(ignore_index=2),
         id="NLL-3d-weights-ignore"),
    # --- our domain: gradient ops emitted by the autodiff
    Case("ReluGrad", [f(3, 4), torch.relu(f(3, 4))], lambda dy, y: dy * (y > 0), domain=OURS),
    Case("SigmoidGrad", [f(3, 4), torch.sigmoid(f(3, 4))], lambda dy, y: dy * y * (1 - y), domain=OURS),
    Case("TanhGrad", [f(3, 4), torch.tanh(f(3, 4))], lambda dy, y: dy * (1 - y * y), domain=OURS),
    Case("SoftmaxGrad", [f(2, 3, 4), torch.softmax(f(2, 3, 4), 1)],
         lambda dy, y: y * (dy - (dy * y).sum(1, keepdim=True)), attrs=dict(axis=1), domain=OURS),
    Case("LogSoftmaxGrad", [f(3, 5), torch.log_softmax(f(3, 5), -1)],
         lambda dy, y: dy - y.exp() * dy.sum(-1, keepdim=True), domain=OURS),
    Case("DropoutGrad", [f(3, 4), f(3, 4) > 0, torch.tensor(0.25), torch.tensor(True)],
         lambda dy, m, r, t: dy * m / 0.75, domain=OURS),
    Case("DropoutGrad", [f(3, 4), f(3, 4) > 0], lambda dy, m: dy, domain=OURS, id="DropoutGrad-inference"),
    Case("SumToShape", [f(2, 3, 4), i64(3, 1)], lambda dy, s: dy.sum(0).sum(1, keepdim=True), domain=OURS),
    Case("ReduceSumGrad", [f(2, 4), i64(2, 3, 4)], lambda dy, s: dy.unsqueeze(1).expand(2, 3, 4),
         attrs=dict(axes=[1], keepdims=0), domain=OURS),
    Case("ReduceSumGrad", [f(1, 1), i64(2, 3)], lambda dy, s: dy.expand(2, 3), domain=OURS, id="ReduceSumGrad-all"),
    Case("ReduceMeanGrad", [f(2, 1, 1), i64(2, 3, 4)], lambda dy, s: dy.expand(2, 3, 4) / 12,
         attrs=dict(axes=[1, -1]), domain=OURS),
    Case("SoftmaxCrossEntropyLossGrad", [torch.tensor(1.5), lp(6, 5), labels(6, classes=5)],
         sce_grad("mean"), domain=OURS),
    Case("SoftmaxCrossEntropyLossGrad", [f(3, 5), lp(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3), pos(4)],
         sce_grad("none", ignore_index=1), attrs=dict(reduction="none", ignore_index=1), domain=OURS,
         id="SCEGrad-3d-weights-ignore-none"),
    Case("SoftmaxCrossEntropyLossGrad", [torch.tensor(0.7), lp(2, 3, 2, 2), labels(2, 2, 2, classes=3)],
         sce_grad("sum"), attrs=dict(reduction="sum"), domain=OURS, id="SCEGrad-4d-sum"),
    Case("NegativeLogLikelihoodLossGrad", [torch.tensor(2.0), lp(6, 5), labels(6, classes=5), pos(5)],
         nll_grad("mean"), domain=OURS),
]


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def single_node_model(case, expected):
    names, graph_inputs, inits, feeds = [], [], [], []
    for i, t in enumerate(case.inputs):
        if t is None:
            names.append("")
            continue
        names.append(f"in{i}")
        if i in case.consts:
            inits.append(numpy_helper.from_array(t.numpy(), f"in{i}"))
        else:
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", ONNX_TYPE[t.dtype], list(t.shape)))
            feeds.append(t)
    outs = [f"out{i}" for i in range(case.n_out)]
    node = helper.make_node(case.op, names, outs, name=f"/test/{case.id}", domain=case.domain, **case.attrs)
    graph = helper.make_graph([node], case.id, graph_inputs,
                              [helper.make_tensor_value_info(n, ONNX_TYPE[e.dtype], list(e.shape))
                               for n, e in zip(outs, expected)], initializer=inits)
    opsets = [helper.make_opsetid("", case.opset), helper.make_opsetid(OURS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString(), feeds


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_torch(case):
    if case.seed is not None:
        torch.manual_seed(case.seed)
    expected = as_tuple(case.ref(*[t for t in case.inputs if t is not None]))
    model, feeds = single_node_model(case, expected)
    engine = _C.Engine(model, False, [False] * len(feeds))
    if case.seed is not None:
        torch.manual_seed(case.seed)
    outs, ctx = engine.forward(feeds)
    assert ctx is None and len(outs) == len(expected)
    for got, want in zip(outs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        torch.testing.assert_close(got, want, **TOL.get(want.dtype, dict(rtol=0, atol=0)))


def test_every_kernel_has_a_case():
    covered = {f"{c.domain}::{c.op}" for c in CASES}
    missing = sorted(set(_C.kernel_ops()) - covered)
    assert not missing, f"kernels without a row in CASES: {missing}"


def test_every_differentiable_op_has_a_kernel():
    # A gradient rule for an op the runtime cannot run would only fail on a user's model.
    missing = sorted(set(_C.gradient_ops()) - set(_C.kernel_ops()))
    assert not missing, f"ops with a gradient entry but no kernel: {missing}"


# --- a 2-layer MLP with cross-entropy, written with onnx.helper: (x, labels, W1, b1, W2, b2)
MLP_INPUTS = ["x", "labels", "W1", "b1", "W2", "b2"]


def mlp_model():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["z1"], name="/fc1/Gemm"),
             helper.make_node("Relu", ["z1"], ["h"], name="/relu/Relu"),
             helper.make_node("Gemm", ["h", "W2", "b2"], ["logits"], name="/fc2/Gemm"),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], name="/loss/SCE")]
    inputs = [vi("x", TensorProto.FLOAT, ["batch", 3]), vi("labels", TensorProto.INT64, ["batch"]),
              vi("W1", TensorProto.FLOAT, [3, 8]), vi("b1", TensorProto.FLOAT, [8]),
              vi("W2", TensorProto.FLOAT, [8, 4]), vi("b2", TensorProto.FLOAT, [4])]
    outputs = [vi("loss", TensorProto.FLOAT, []), vi("logits", TensorProto.FLOAT, ["batch", 4])]
    graph = helper.make_graph(nodes, "mlp", inputs, outputs,
                              value_info=[vi("z1", TensorProto.FLOAT, ["batch", 8]),
                                          vi("h", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10).SerializeToString()


def mlp_params():
    return [f(3, 8), f(8), f(8, 4), f(4)]


def mlp_reference(x, lab, params, dloss, dlogits):
    ps = [p.clone().requires_grad_() for p in params]
    logits = torch.relu(x @ ps[0] + ps[1]) @ ps[2] + ps[3]
    loss = F.cross_entropy(logits, lab)
    grads = torch.autograd.grad([loss, logits], ps, [dloss, dlogits])
    return loss.detach(), logits.detach(), grads


@pytest.fixture(scope="module")
def mlp_engine():
    return _C.Engine(mlp_model(), True, [False, False, True, True, True, True])


def test_training_mlp_matches_autograd(mlp_engine):
    params = mlp_params()
    assert mlp_engine.input_names == MLP_INPUTS and mlp_engine.output_names == ["loss", "logits"]
    assert mlp_engine.output_differentiable == [True, True]
    assert mlp_engine.input_grad_available == [False, False, True, True, True, True]
    for batch in (5, 2):  # symbolic batch: one engine serves every batch size
        x, lab = f(batch, 3), labels(batch, classes=4)
        (loss, logits), ctx = mlp_engine.forward([x, lab, *params])
        dloss, dlogits = torch.tensor(1.0), f(batch, 4)
        grads = mlp_engine.backward(ctx, [dloss, dlogits])
        ref_loss, ref_logits, ref_grads = mlp_reference(x, lab, params, dloss, dlogits)
        torch.testing.assert_close(loss, ref_loss)
        torch.testing.assert_close(logits, ref_logits)
        assert grads[0] is None and grads[1] is None
        for g, r in zip(grads[2:], ref_grads):
            torch.testing.assert_close(g, r)


def test_none_output_gradient_counts_as_zero(mlp_engine):
    params, x, lab = mlp_params(), f(3, 3), labels(3, classes=4)
    _, ctx = mlp_engine.forward([x, lab, *params])
    grads = mlp_engine.backward(ctx, [torch.tensor(1.0), None])
    _, _, ref = mlp_reference(x, lab, params, torch.tensor(1.0), torch.zeros(3, 4))
    for g, r in zip(grads[2:], ref):
        torch.testing.assert_close(g, r)


def test_two_run_contexts_alive(mlp_engine):
    # Gradient accumulation: two forwards in flight, backwards in the opposite order.
    params = mlp_params()
    batches = [(f(4, 3), labels(4, classes=4)), (f(6, 3), labels(6, classes=4))]
    ctxs = [mlp_engine.forward([x, lab, *params])[1] for x, lab in batches]
    assert all(c.num_saved > 0 for c in ctxs)
    for (x, lab), ctx in reversed(list(zip(batches, ctxs))):
        grads = mlp_engine.backward(ctx, [torch.tensor(1.0), torch.zeros(len(x), 4)])
        _, _, ref = mlp_reference(x, lab, params, torch.tensor(1.0), torch.zeros(len(x), 4))
        for g, r in zip(grads[2:], ref):
            torch.testing.assert_close(g, r)


def test_backward_twice_raises(mlp_engine):
    _, ctx = mlp_engine.forward([f(2, 3), labels(2, classes=4), *mlp_params()])
    mlp_engine.backward(ctx, [torch.tensor(1.0), None])
    assert ctx.consumed and ctx.num_saved == 0  # the first backward released the saved set
    with pytest.raises(_C.RunContextError, match="backward called twice"):
        mlp_engine.backward(ctx, [torch.tensor(1.0), None])
    assert issubclass(_C.RunContextError, RuntimeError)


def test_context_of_another_engine_is_rejected(mlp_engine):
    other = _C.Engine(mlp_model(), True, [False, False, True, True, True, True])
    _, ctx = other.forward([f(2, 3), labels(2, classes=4), *mlp_params()])
    with pytest.raises(_C.RunContextError, match="another engine"):
        mlp_engine.backward(ctx, [torch.tensor(1.0), None])


def test_stats_and_exported_graphs(mlp_engine):
    s = mlp_engine.stats()
    assert s["num_forward_nodes"] >= 4 and s["num_backward_nodes"] > 0  # autodiff may add Shape nodes
    assert 0 < s["num_saved_activations"] <= s["num_saved"] == len(s["saved_names"])
    assert s["num_forward_values"] >= s["num_saved_activations"]
    tg = onnx.load_from_string(mlp_engine.training_graph_onnx())
    assert [o.name for o in tg.graph.output][:2] == ["loss", "logits"] and len(tg.graph.output) > 2
    assert len(onnx.load_from_string(mlp_engine.forward_graph_onnx()).graph.node) == 4


def test_inference_engine_has_no_backward():
    eng = _C.Engine(mlp_model(), False, [])
    outs, ctx = eng.forward([f(2, 3), labels(2, classes=4), *mlp_params()])
    assert ctx is None and len(outs) == 2 and eng.output_differentiable == [False, False]
    with pytest.raises(_C.RunContextError, match="training=False"):
        eng.training_graph_onnx()


# --- the error contract: every message names what is wrong
def test_input_dtype_mismatch_is_type_error_naming_input(mlp_engine):
    with pytest.raises(TypeError, match=r"'x'.*expected dtype float32, got float64"):
        mlp_engine.forward([f(2, 3, dtype=torch.float64), labels(2, classes=4), *mlp_params()])
    with pytest.raises(TypeError, match=r"'labels'.*expected dtype int64.*got int32"):
        mlp_engine.forward([f(2, 3), labels(2, classes=4).int(), *mlp_params()])


def test_input_rank_and_size_mismatch(mlp_engine):
    with pytest.raises(TypeError, match=r"'x'.*expected rank 2.*got rank 3"):
        mlp_engine.forward([f(2, 3, 1), labels(2, classes=4), *mlp_params()])
    with pytest.raises(TypeError, match=r"'W1'.*expected shape \[3,8\]"):
        mlp_engine.forward([f(2, 3), labels(2, classes=4), f(3, 9), *mlp_params()[1:]])


def test_wrong_input_count(mlp_engine):
    with pytest.raises(TypeError, match="expected 6 inputs .*got 5"):
        mlp_engine.forward([f(2, 3), labels(2, classes=4), *mlp_params()[:3]])


def test_unsupported_op_fails_at_construction_naming_op_and_node():
    graph = helper.make_graph(
        [helper.make_node("Det", ["a"], ["d"], name="/model/Det_3")], "det",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    with pytest.raises(_C.UnsupportedOpError, match=r"'Det' \(node /model/Det_3\).*no kernel"):
        _C.Engine(model.SerializeToString(), False, [])


def test_kernel_failure_names_the_node():
    case = Case("Reshape", [f(2, 3), i64(4, 2)], lambda x, s: x, id="bad")
    model, feeds = single_node_model(case, [torch.zeros(4, 2)])
    with pytest.raises(_C.KernelError, match=r"Reshape \(node /test/bad\)"):
        _C.Engine(model, False, []).forward(feeds)


def test_unknown_disabled_pass_is_rejected():
    with pytest.raises(ValueError, match="no pass named 'not-a-pass'"):
        _C.Engine(mlp_model(), False, [], ["not-a-pass"])


def test_malformed_bytes_raise_import_error():
    with pytest.raises(_C.OnnxImportError):
        _C.Engine(b"\x08\x01not an onnx model at all", False, [])
    assert issubclass(_C.OnnxImportError, RuntimeError)
