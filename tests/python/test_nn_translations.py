"""Our translations of NN ops (torch_ort/ortmodule/export/translations/nn.py) through ORTModule, against
eager PyTorch: cross-entropy with label smoothing / ignore_index / weights / (N, C, d) inputs /
probability targets, embedding padding_idx, dropout inside scaled_dot_product_attention, and a
small transformer-style LM (Embedding, LayerNorm, GELU, Dropout) trained for a few steps."""
import copy

import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

from torch_ort import ORTModule
from torch_ort.ortmodule.export.exporter import export_module


class Fn(torch.nn.Module):
    """A function of the inputs, with x first scaled along `axis` by a parameter (so that
    parameters get gradients too)."""

    def __init__(self, fn, d=5, axis=1):
        super().__init__()
        self.fn, self.axis = fn, axis
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x, *rest):
        shape = [1] * x.dim()
        shape[self.axis] = -1
        return self.fn(x * self.scale.reshape(shape), *rest)


def nodes(module, *args):
    graph = onnx.load_from_string(export_module(module, args, {}, None).onnx_bytes).graph
    return [n for n in graph.node if n.op_type != "Constant"]


def attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def check_parity(fn, *args, rtol=1e-5, atol=1e-6, d=5):
    torch.manual_seed(0)
    eager = Fn(fn, d)
    ours = ORTModule(copy.deepcopy(eager))
    x = args[0]
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(xe, *args[1:]), ours(xo, *args[1:])
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    dy = torch.rand_like(want) + 0.5
    want.backward(dy)
    got.backward(dy)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=rtol, atol=atol)
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# --- cross-entropy
def test_stock_export_drops_label_smoothing_ours_keeps_it():
    m = Fn(lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1, ignore_index=-1))
    args = (torch.randn(4, 5), torch.randint(0, 5, (4,)))
    stock = torch.onnx.export(m, args, dynamo=True, optimize=False, verbose=False).model_proto.graph
    (sce,) = [n for n in stock.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    assert "label_smoothing" not in attrs(sce)  # what the exporter would have trained with
    (ce,) = [n for n in nodes(m, *args) if "CrossEntropy" in n.op_type]
    assert (ce.domain, ce.op_type) == ("com.torch_ort", "CrossEntropyLoss")
    assert attrs(ce)["ignore_index"] == -1 and attrs(ce)["label_smoothing"] == pytest.approx(0.1)
    # Without smoothing the standard ONNX op stays.
    plain = nodes(Fn(lambda x, y: F.cross_entropy(x, y)), *args)
    assert [n.op_type for n in plain if "Entropy" in n.op_type] == ["SoftmaxCrossEntropyLoss"]


LABELS = torch.tensor([0, 4, -1, 2, 4, -1, 1])
W5 = torch.linspace(0.5, 2, 5)  # class weights (a constant of the exported graph)
CE_CASES = {
    "smooth-mean-ignore": (lambda x, y: F.cross_entropy(x, y, ignore_index=-1, label_smoothing=0.1), (7, 5), LABELS),
    "smooth-sum": (lambda x, y: F.cross_entropy(x, y, reduction="sum", label_smoothing=0.2), (7, 5), LABELS.clamp(min=0)),
    "smooth-none-ignore": (lambda x, y: F.cross_entropy(x, y, reduction="none", ignore_index=-1, label_smoothing=0.1),
                           (7, 5), LABELS),
    "smooth-weights-ignore": (lambda x, y: F.cross_entropy(x, y, weight=W5, ignore_index=4,
                                                           label_smoothing=0.1), (7, 5), LABELS.clamp(min=0)),
    "smooth-3d": (lambda x, y: F.cross_entropy(x, y, ignore_index=-1, label_smoothing=0.1), (3, 5, 4),
                  torch.tensor([[0, 1, -1, 4], [2, 2, 3, -1], [4, 0, 1, 1]])),
    "smooth-3d-weights-none": (lambda x, y: F.cross_entropy(x, y, weight=W5, reduction="none",
                                                            label_smoothing=0.3), (3, 5, 4), torch.randint(0, 5, (3, 4))),
    "3d-weights-ignore": (lambda x, y: F.cross_entropy(x, y, weight=W5, ignore_index=2),
                          (3, 5, 4), torch.randint(0, 5, (3, 4))),
    "all-ignored-mean-is-nan": (lambda x, y: F.cross_entropy(x, y, ignore_index=-1, label_smoothing=0.1), (3, 5),
                                torch.full((3,), -1)),
}


@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy_parity(strict, case):
    fn, shape, y = CE_CASES[case]
    check_parity(fn, torch.randn(*shape), y)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_probability_targets(strict, smoothing):
    # The stock export would feed these probabilities to SoftmaxCrossEntropyLoss as indices.
    target = torch.softmax(torch.randn(6, 5), 1)
    fn = lambda x, t: F.cross_entropy(x, t, weight=W5, label_smoothing=smoothing)  # noqa: E731
    check_parity(fn, torch.randn(6, 5), target)
    assert not [n for n in nodes(Fn(fn), torch.randn(6, 5), target) if "CrossEntropy" in n.op_type]


# --- embedding
def test_embedding_padding_idx_exported_and_gets_no_gradient(strict):
    emb = torch.nn.Embedding(10, 4, padding_idx=1)
    ids = torch.tensor([[1, 3, 1], [0, 9, 3]])
    stock = torch.onnx.export(emb, (ids,), dynamo=True, optimize=False, verbose=False).model_proto.graph
    assert [n.op_type for n in stock.node] == ["Gather"]  # padding_idx is gone in the stock export
    (node,) = nodes(emb, ids)
    assert (node.domain, node.op_type, attrs(node)["padding_idx"]) == ("com.torch_ort", "Embedding", 1)
    ours = ORTModule(copy.deepcopy(emb))
    dy = torch.randn(2, 3, 4)
    emb(ids).backward(dy)
    ours(ids).backward(dy)
    assert torch.equal(ours.module.weight.grad, emb.weight.grad)  # same ATen backward: exact
    assert not ours.module.weight.grad[1].any() and ours.module.weight.grad[3].any()


def test_embedding_scale_grad_by_freq(strict):
    emb = torch.nn.Embedding(8, 3, scale_grad_by_freq=True)
    ours = ORTModule(copy.deepcopy(emb))
    ids = torch.tensor([2, 2, 5, 2, 7])
    emb(ids).sum().backward()
    ours(ids).sum().backward()
    assert torch.equal(ours.module.weight.grad, emb.weight.grad)


class TiedLM(torch.nn.Module):
    def __init__(self, **embedding):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6, **embedding)
        self.mix = torch.nn.Linear(6, 6)

    def forward(self, ids):
        h = torch.tanh(self.mix(self.emb(ids)))
        return F.cross_entropy((h @ self.emb.weight.t()).flatten(0, 1), ids.flatten())


@pytest.mark.parametrize("embedding", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True}],
                         ids=["plain", "padding_idx", "scale_grad_by_freq"])
def test_tied_embedding_gradient_adds_into_the_heads(strict, embedding):
    """The embedding's gradient is added into the tied head's (EmbeddingGrad's accumulator) instead
    of a zero-filled weight-sized tensor and a sum: the same gradients and steps as eager."""
    torch.manual_seed(0)
    eager = TiedLM(**embedding)
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(0, 11, (3, 5), generator=gen)
        ids[0, :2] = 1  # padding_idx rows (and a repeated index)
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad()
            model(ids).backward()
        torch.testing.assert_close(ours.module.emb.weight.grad, eager.emb.weight.grad, rtol=1e-5, atol=1e-6)
        for opt in opts:
            opt.step()


def test_sparse_embedding_runs_through_the_aten_fallback(strict):
    """Our Embedding translation refuses sparse=True (its gradient is dense); the ATen fallback
    then carries aten::embedding (within that one export), and autograd's sparse gradient
    reaches SparseAdam as in eager."""
    torch.manual_seed(0)
    eager = torch.nn.Embedding(8, 3, sparse=True)
    ours = ORTModule(copy.deepcopy(eager))
    idx, w = torch.tensor([1, 2, 2, 5]), torch.arange(12.0).view(4, 3)
    for m in (eager, ours):
        (m(idx) * w).sum().backward()
    assert ours.weight.grad.is_sparse
    torch.testing.assert_close(ours.weight.grad.to_dense(), eager.weight.grad.to_dense(), rtol=0, atol=0)
    opts = [torch.optim.SparseAdam(m.parameters(), lr=0.1) for m in (eager, ours)]
    for opt in opts:
        opt.step()
    torch.testing.assert_close(ours.weight, eager.weight, rtol=0, atol=0)
    assert ours.export_count == 1  # refused by our translation, routed to ATenOp in the same export


# --- scaled_dot_product_attention with dropout
def test_sdpa_dropout_is_exported_in_training_mode():
    q = torch.randn(2, 2, 6, 4)
    m = Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1), d=4, axis=-1)
    stock = torch.onnx.export(m, (q, q, q), dynamo=True, optimize=False, verbose=False).model_proto.graph
    (d,) = [n for n in stock.node if n.op_type == "Dropout"]
    assert len(d.input) < 3  # no training_mode: the stock export is an identity
    graph = onnx.load_from_string(export_module(m, (q, q, q), {}, None).onnx_bytes).graph
    consts = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in graph.node
              if n.op_type == "Constant" and n.attribute[0].name == "value"}
    (d,) = [n for n in graph.node if n.op_type == "Dropout"]
    assert float(consts[d.input[1]]) == 0.1 and consts[d.input[1]].dtype.name == "float64"
    assert bool(consts[d.input[2]]) is True


@pytest.mark.parametrize("mask", ["float", "bool", "none"])
def test_sdpa_with_dropout_matches_eager(strict, mask):
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    masks = {"float": torch.randn(5, 5), "bool": torch.rand(2, 1, 5, 5) > 0.3, "none": None}
    am = masks[mask]
    if am is not None and am.dtype == torch.bool:
        am[..., 0] = True  # no fully masked row (eager's safe softmax gives 0 there, see the report)

    def fn(x, k, v, *m):
        return F.scaled_dot_product_attention(x, k, v, attn_mask=m[0] if m else None, dropout_p=0.3, scale=0.4)
    torch.manual_seed(0)
    eager = Fn(fn, d=4, axis=-1)
    ours = ORTModule(copy.deepcopy(eager))
    extra = () if am is None else (am,)
    qe, qo = q.clone().requires_grad_(), q.clone().requires_grad_()
    torch.manual_seed(9)
    want = eager(qe, k, v, *extra)
    torch.manual_seed(9)
    got = ours(qo, k, v, *extra)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(qo.grad, qe.grad, rtol=1e-5, atol=1e-6)
