"""The general passes (constant_folding, cse) and the GEMM/loss fusions (matmul_bias_fusion,
transpose_matmul_fusion, softmax_cross_entropy_fusion) on real exports: each fires on the NanoGPT
and BERT forward graphs (counted in engine.forward_graph_onnx()), and training keeps eager parity
with all passes on and with each of them disabled in turn.

Tolerances are test_models.py's (fp32: losses rtol 1e-4, gradients rtol 1e-3 / atol 1e-5)."""
import collections

import onnx
import pytest
import torch
import torch.nn.functional as F

import model_zoo
from test_models import GRAD_TOL, run_parity
from torch_ort import ORTModule, _C

OURS = "com.torch_ort"
MY_PASSES = ["constant_folding", "cse", "softmax_cross_entropy_fusion", "matmul_bias_fusion",
             "transpose_matmul_fusion"]
MODELS = ["nanogpt", "bert_cls"]


def runner_of(ours):
    return next(iter(ours._plan_cache.runners()))


def forward_graph(runner, disabled=()):
    """The optimised forward graph of the runner's export, built with `disabled` passes off (and
    whatever the runner itself disables)."""
    off = sorted(set(runner._disabled_passes()) | set(disabled))
    engine = _C.Engine(runner.export.onnx_bytes, False, [], off)
    return onnx.load_from_string(engine.forward_graph_onnx()).graph


def op(n):
    return (n.domain + "::" if n.domain else "") + n.op_type


def histogram(graph):
    return collections.Counter(op(n) for n in graph.node)


def swaps_last_two(node):
    if node is None or node.op_type != "Transpose":
        return False
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
    r = len(perm)
    return r >= 2 and perm[:-2] == list(range(r - 2)) and perm[-2:] == [r - 1, r - 2]


def exported(name):
    """One training step of the zoo model through ORTModule: its runner holds the export."""
    factory, make_batch = model_zoo.ZOO[name]
    torch.manual_seed(0)
    ours = ORTModule(factory())
    args, kwargs = make_batch(2, 8, torch.Generator().manual_seed(0))
    model_zoo.loss_of(ours(*args, **kwargs)).backward()
    return ours, runner_of(ours)


@pytest.fixture(scope="module", params=MODELS)
def model_export(request):
    mp = pytest.MonkeyPatch()
    mp.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    try:
        ours, runner = exported(request.param)
    finally:
        mp.undo()
    return request.param, ours, runner


def others():
    """Every optional pass that is not one of these five (fusions by other passes may claim the
    same Adds and Transposes; counting ours is clearest with them off)."""
    required = set(_C.required_pass_names())
    return [p for p in _C.pass_names() if p not in MY_PASSES and p not in required and p != "dce"]


def test_constant_folding_removes_constants_and_shape_arithmetic(model_export):
    name, _, runner = model_export
    before = histogram(forward_graph(runner, MY_PASSES))
    after = histogram(forward_graph(runner, ["cse", "softmax_cross_entropy_fusion", "matmul_bias_fusion",
                                             "transpose_matmul_fusion"]))
    assert before["Constant"] > 20 and after["Constant"] == 0, (before, after)
    shape_ops = ["Shape", "Gather", "Slice", "Concat", "Sqrt", "CastLike", "Cast", "Div", "Unsqueeze"]
    gone = {k: before[k] - after[k] for k in shape_ops if before[k] != after[k]}
    assert sum(before.values()) - sum(after.values()) > before["Constant"], (name, gone)
    assert after["Sqrt"] == 0 and after["CastLike"] == 0, (name, after)  # the attention scale folded
    print(f"{name}: constant_folding removes {sum(before.values()) - sum(after.values())} nodes "
          f"({before['Constant']} Constant, then {gone})")


def node_keys(graph):
    """(op, inputs, attributes) per deterministic node, an initializer input named by its content
    (the exporter writes one copy of a constant per use)."""
    content = {t.name: t.SerializeToString().replace(t.name.encode(), b"") for t in graph.initializer}
    keys = []
    for n in graph.node:
        if "Dropout" in n.op_type or "Random" in n.op_type or n.op_type in ("PythonOp", "ATenOp"):
            continue
        attrs = tuple(sorted((a.name, a.SerializeToString()) for a in n.attribute))
        keys.append((n.domain, n.op_type, tuple(content.get(i, i) for i in n.input), attrs))
    return keys


def test_cse_leaves_no_duplicate_node(model_export):
    name, _, runner = model_export
    without = node_keys(forward_graph(runner, ["cse"]))
    with_cse = node_keys(forward_graph(runner))
    assert len(without) != len(set(without)), f"{name}: the export has duplicates for cse to merge"
    dups = [k for k, c in collections.Counter(with_cse).items() if c > 1]
    assert not dups, f"{name}: duplicates left after cse: {dups[:3]}"
    print(f"{name}: cse leaves {len(with_cse)} of {len(without)} nodes")


def test_matmul_bias_and_transpose_fusions_fire(model_export):
    name, ours, runner = model_export
    g = forward_graph(runner, others())
    h = histogram(g)
    graph_inputs = {i.name for i in g.input}
    fused_bias = [n for n in g.node if op(n) == f"{OURS}::FusedMatMul" and len(n.input) == 3 and n.input[2]]
    # Every Linear with a bias on a 3-D activation: nanoGPT 4 per block; BERT 6 per layer (q, k, v,
    # attention output, intermediate, output); BERT's 2-D pooler/classifier export as Gemm.
    expected = {"nanogpt": 4 * model_zoo.LAYERS, "bert_cls": 6 * model_zoo.LAYERS}[name]
    assert len(fused_bias) == expected, (name, h)
    producers = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if op(n) in (f"{OURS}::FusedMatMul", "Gemm", "MatMul"):
            for x in n.input[:2]:
                assert not swaps_last_two(producers.get(x)), f"{name}: {n.name} reads a Transpose of the last dims"
    # The weights are read directly, the transpose a flag: no Transpose of a parameter is left.
    assert not [n for n in g.node if n.op_type == "Transpose" and n.input[0] in graph_inputs], name
    assert all(any(a.name == "transB" and a.i == 1 for a in n.attribute) for n in fused_bias)


@pytest.mark.parametrize("name", MODELS)
def test_passes_fire_in_training(strict, name):
    # Parity with each of these passes disabled: test_pass_parity.py (every pass, every zoo model).
    _, ours, _, _ = run_parity(name, steps=3, shapes=((4, 16), (2, 9)))  # asserts the parity
    engine = next(iter(runner_of(ours)._engines.values()))
    fired = set(engine.stats()["passes_changed"])
    assert {"constant_folding", "cse", "matmul_bias_fusion", "transpose_matmul_fusion"} <= fired, fired


class NllOfLogSoftmax(torch.nn.Module):
    def __init__(self, dim, **loss_kw):
        super().__init__()
        self.proj = torch.nn.Linear(6, 5)
        self.dim, self.loss_kw = dim, loss_kw

    def forward(self, x, y):
        return F.nll_loss(F.log_softmax(self.proj(x), dim=self.dim), y, **self.loss_kw)  # (N, 5)


def nll_case():
    g = torch.Generator().manual_seed(3)
    return torch.randn(7, 6, generator=g), torch.randint(0, 5, (7,), generator=g)


@pytest.mark.parametrize("dim, kw", [
    (1, {}), (-1, dict(reduction="sum")), (1, dict(ignore_index=2)),
    (1, dict(weight=torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0]), reduction="mean")),
], ids=["2d", "2d-sum", "2d-ignore", "2d-weight"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_nll_of_log_softmax_fuses_with_eager_parity(strict, monkeypatch, dim, kw, fused):
    """The exporter emits LogSoftmax + NegativeLogLikelihoodLoss for 2-D scores only (3-D nll_loss
    is decomposed into GatherElements arithmetic); tests/cpp covers the (N, C, d) pair itself."""
    if not fused:
        monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", "softmax_cross_entropy_fusion")
    torch.manual_seed(0)
    eager = NllOfLogSoftmax(dim, **kw)
    ours = ORTModule(NllOfLogSoftmax(dim, **kw))
    ours.module.load_state_dict(eager.state_dict())
    x, y = nll_case()
    loss_e = eager(x, y)
    loss_e.backward()
    loss_o = ours(x, y)
    loss_o.backward()
    torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6)
    for (n, pe), po in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(po.grad, pe.grad, **GRAD_TOL, msg=lambda m: f"{n}: {m}")
    h = histogram(onnx.load_from_string(next(iter(runner_of(ours)._engines.values())).forward_graph_onnx()).graph)
    if fused:
        assert h["SoftmaxCrossEntropyLoss"] == 1 and h["LogSoftmax"] == 0 and h["NegativeLogLikelihoodLoss"] == 0, h
    else:
        assert h["LogSoftmax"] == 1 and h["NegativeLogLikelihoodLoss"] == 1, h


def test_log_probs_read_elsewhere_stay_unfused(strict):
    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(6, 5)

        def forward(self, x, y):
            lp = F.log_softmax(self.proj(x), dim=1)
            return F.nll_loss(lp, y) + lp.exp().mean()

    torch.manual_seed(0)
    eager = Both()
    ours = ORTModule(Both())
    ours.module.load_state_dict(eager.state_dict())
    x, y = nll_case()
    loss_e, loss_o = eager(x, y), ours(x, y)
    loss_e.backward()
    loss_o.backward()
    torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.module.proj.weight.grad, eager.proj.weight.grad, **GRAD_TOL)
    h = histogram(onnx.load_from_string(next(iter(runner_of(ours)._engines.values())).forward_graph_onnx()).graph)
    assert h["LogSoftmax"] == 1 and h["NegativeLogLikelihoodLoss"] == 1, h
