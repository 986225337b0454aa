"""Kernel parity: one table row per op case, each run as a single-node ONNX model through
torch_ort._C.Engine (inference) and compared with an eager PyTorch reference. Plus the engine's
error contract (bad inputs, unsupported ops, bad bytes) and run-context rules."""

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from torch_ort import _C

from op_table import ALL_CASES as CASES
from op_table import OURS, TOL, Case, as_tuple, f, i64, labels, single_node_model  # noqa: F401

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


@pytest.mark.parametrize("op, inputs", [
    ("GatherGrad", [f(4, 3), i64(5, 3), i64(1, -1, 1, 0), f(3, 5)]),
    ("EmbeddingGrad", [f(4, 3), i64(1, 2, 1, 0), i64(5, 3), f(5, 3).double()]),
])
def test_a_gradient_accumulator_of_another_shape_or_dtype_is_an_error_naming_it(op, inputs):
    case = Case(op, inputs, None, domain=OURS)
    model, feeds = single_node_model(case, [torch.zeros(5, 3)])
    engine = _C.Engine(model, False, [False] * len(feeds))
    with pytest.raises(_C.KernelError, match=r"accumulator of shape \[[35], [35]\] \((Float|Double)\) does not "
                                             r"match the gradient's \[5, 3\] \(Float\)"):
        engine.forward(feeds)


@pytest.mark.parametrize("kv_heads", [(3, 3), (2, 4)])
def test_attention_heads_that_neither_match_nor_group_are_an_error_naming_them(kv_heads):
    hk, hv = kv_heads
    case = Case("Attention", [f(2, 4, 5, 8), f(2, hk, 7, 8), f(2, hv, 7, 8)], None, dict(causal=1), domain=OURS,
                n_out=2)
    model, feeds = single_node_model(case, [torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5)])
    engine = _C.Engine(model, False, [False] * len(feeds))
    with pytest.raises(_C.KernelError, match=rf"K and V have {hk} and {hv} heads; each must be Q's 4 or 1, or both one "
                                             r"count that divides it \(grouped-query attention\)"):
        engine.forward(feeds)


@pytest.mark.parametrize("inputs, join, width, why", [
    ([f(4, 6), f(4, 6), f(6)], [0, 2], 12, r"join: input 2 of shape \[6\] is not of the output's shape \[4, 6\]"),
    ([f(4, 6), f(4, 6)], [0], 6, r"join must name two inputs or more, got \[0\]"),
    ([f(4, 6), f(4, 6)], [0, 0], 12, r"join \[0, 0\] must name distinct inputs of the 2"),
])
def test_a_join_the_fused_gradient_cannot_write_is_an_error_naming_it(inputs, join, width, why):
    ops = ["Mul", "Add"] if len(inputs) == 3 else ["Mul"]
    operands = [0, 1, len(inputs), 2] if len(inputs) == 3 else [0, 1]
    case = Case("FusedElementwiseGrad", [f(4, 6)] + inputs, None, dict(ops=ops, operands=operands, join=join),
                domain=OURS)
    model, feeds = single_node_model(case, [torch.zeros(4, width)])
    engine = _C.Engine(model, False, [False] * len(feeds))
    with pytest.raises(_C.KernelError, match=why):
        engine.forward(feeds)


# Kernels a single-node model cannot drive, and where they are tested instead.
NO_SINGLE_NODE_CASE = {
    "com.torch_ort::ATenOpGrad": "reads the autograd history ATenOp's forward made; "
                                 "test_op_gradients.py runs it for every ATenOp row",
    "com.torch_ort::PythonOp": "names a Function registered by an export in this process; "
                               "test_python_op.py runs it through ORTModule (and an unknown id)",
}


def test_every_kernel_has_a_case():
    covered = {f"{c.domain}::{c.op}" for c in CASES} | set(NO_SINGLE_NODE_CASE)
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
        [helper.make_node("DepthToSpace", ["a"], ["d"], name="/model/DepthToSpace_3", blocksize=2)], "d2s",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 1, 1])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    with pytest.raises(_C.UnsupportedOpError, match=r"'DepthToSpace' \(node /model/DepthToSpace_3\).*no kernel"):
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
