"""bias_gelu_fusion and elementwise_chain_fusion on real exports: the passes fire on nanoGPT, HF GPT-2
and BERT (counted in the engine's forward graph), training keeps eager parity with the passes on and
with each one disabled, both CPU paths of BiasGelu match the reference, and a bad program is an error
that names the node."""
import collections
import copy

import onnx
import pytest
import torch
from onnx import helper

import model_zoo
from op_table import ALL_CASES, OURS, TOL, Case, as_tuple, expect_named_error, f, single_node_model
from torch_ort import ORTModule, _C

LAYERS = 2  # every zoo model has two blocks, one GELU each


def forward_graph(name, monkeypatch, disabled=()):
    monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", ",".join(disabled))
    factory, make_batch = model_zoo.ZOO[name]
    torch.manual_seed(0)
    ours = ORTModule(factory())
    args, kwargs = make_batch(4, 16, torch.Generator().manual_seed(0))
    model_zoo.loss_of(ours(*args, **kwargs)).backward()
    runner = list(ours._plan_cache.runners())[0]
    engine = list(runner._engines.values())[0]
    return onnx.load_from_string(engine.forward_graph_onnx()).graph


def histogram(graph):
    return collections.Counter((n.domain + "::" if n.domain else "") + n.op_type for n in graph.node)


# name -> whether the exporter leaves the bias Add beside the GELU (nn.Linear + nn.GELU: yes; HF GPT-2's
# Conv1D exports addmm, so its decomposed gelu_new meets no Add).
BIAS_FOLDED = {"nanogpt": True, "bert_cls": True, "gpt2": False}


@pytest.mark.parametrize("name", sorted(BIAS_FOLDED))
def test_bias_gelu_fires_on_real_exports(strict, monkeypatch, name):
    graph = forward_graph(name, monkeypatch)
    ops = histogram(graph)
    assert ops[f"{OURS}::BiasGelu"] == LAYERS, ops
    assert ops["Gelu"] == 0 and ops["Pow"] == 0 and ops["Erf"] == 0, ops
    for n in graph.node:
        if n.op_type == "BiasGelu":
            assert len(n.input) == (2 if BIAS_FOLDED[name] else 1), n
    expected = "none" if name == "bert_cls" else "tanh"  # BERT: exact GELU; nanoGPT / gelu_new: tanh
    assert {helper.get_attribute_value(a).decode() for n in graph.node if n.op_type == "BiasGelu"
            for a in n.attribute if a.name == "approximate"} == {expected}


def test_chain_fusion_takes_gelu_new_when_bias_gelu_is_off(strict, monkeypatch):
    graph = forward_graph("gpt2", monkeypatch, disabled=["bias_gelu_fusion"])
    ops = histogram(graph)
    assert ops[f"{OURS}::FusedElementwise"] == LAYERS, ops
    assert ops["Pow"] == 0 and ops["Tanh"] == 0, ops
    programs = [n for n in graph.node if n.op_type == "FusedElementwise"]
    for n in programs:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert [o.decode() for o in attrs["ops"]] == ["Mul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul"]
        assert len(n.input) == 1  # x alone: the five scalars are folded into the program


# Training parity with each of these passes disabled: test_pass_parity.py.


BIAS_GELU_ROWS = [c for c in ALL_CASES if c.op in ("BiasGelu", "BiasGeluGrad")]


@pytest.mark.parametrize("case", BIAS_GELU_ROWS, ids=[c.id for c in BIAS_GELU_ROWS])
def test_bias_gelu_rows_on_each_cpu_path(cpu_path, case):
    """The AVX-512 loop and, with it switched off ("portable"), the ATen reference path, each
    against the row's unfused eager reference at the op table's tolerance."""
    expected = as_tuple(case.ref(*[t for t in case.inputs if t is not None]))
    model, feeds = single_node_model(case, expected)
    outs, _ = _C.Engine(model, False, [False] * len(feeds)).forward(feeds)
    torch.testing.assert_close(outs[0], expected[0], **TOL[expected[0].dtype])


# Max |error| against float64 GELU / GELU' over x in [-10, 10], stated per direction: about one fp32
# ulp of the largest |y| (ulp(10) = 9.5e-7). ATen's fp32 kernel measures 1.2e-6 forward (erf) and
# 1.0e-6 backward (tanh) on the same grid (benchmarks/results/fused_kernels.md).
LOOP_TOL = {"fwd": 6e-7, "bwd": 3e-7}


@pytest.mark.skipif(_C.optim_cpu_path() != "avx512", reason="the BiasGelu loop needs AVX-512")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_loop_accuracy(approximate):
    aten = torch.ops.aten
    # 5 columns: every row ends in a masked tail; > 1M elements, where the exact form takes the loop.
    x = torch.linspace(-10, 10, 5 * 209716).reshape(209716, 5)
    b = torch.zeros(5)
    dy = torch.ones_like(x)
    y64 = torch.nn.functional.gelu(x.double(), approximate=approximate)
    g64 = aten.gelu_backward(dy.double(), x.double(), approximate=approximate)
    attrs = dict(approximate=approximate)
    fwd = single_node_model(Case("BiasGelu", [x, b], None, attrs=attrs, domain=OURS), [y64.float()])[0]
    bwd = single_node_model(Case("BiasGeluGrad", [dy, x, b], None, attrs=attrs, domain=OURS), [g64.float()])[0]
    y = _C.Engine(fwd, False, [False, False]).forward([x, b])[0][0]
    g = _C.Engine(bwd, False, [False] * 3).forward([dy, x, b])[0][0]
    assert (y.double() - y64).abs().max().item() <= LOOP_TOL["fwd"]
    assert (g.double() - g64).abs().max().item() <= LOOP_TOL["bwd"]
    if approximate == "none":
        # Relative accuracy where GELU is tiny (x < -3): Φ comes from erfc, not 1 + erf (float64 ATen
        # cancels there too, so the exact value is x·erfc(−x/√2)/2 in float64).
        exact = x.double() * 0.5 * torch.erfc(-x.double() / 2 ** 0.5)
        neg = x < -3
        assert ((y.double() - exact)[neg] / exact[neg]).abs().max().item() < 1e-5


def test_bias_gelu_wrong_bias_shape_names_the_node():
    # [5] against [4, 6] fails shape inference; [1, 6] broadcasts but is no last-dim bias: the kernel.
    for bias, match in [(f(5), r"cannot broadcast \[4,6\] with \[5\]"), (f(1, 6), "bias must be 1-D of X's last dim")]:
        case = Case("BiasGelu", [f(4, 6), bias], lambda x, b: x, domain=OURS, id="bad-bias")
        model, feeds = single_node_model(case, [f(4, 6)])
        expect_named_error(model, feeds, r"(?s)bad-bias.*" + match)


def test_fused_elementwise_bad_program_names_the_node():
    for attrs, match in [(dict(ops=["Mul", "Frobnicate"], operands=[0, 0, 1, 0]), "unsupported op 'Frobnicate'"),
                         (dict(ops=["Mul"], operands=[0, 7]), "operand 7 is neither"),
                         (dict(ops=["Pow"], operands=[0, 0]), "Pow's exponent must be a constant"),
                         (dict(ops=["Tanh"], operands=[0]), "needs a program")]:
        case = Case("FusedElementwise", [f(2, 3)], lambda x: x, attrs=attrs, domain=OURS, id="bad-program")
        model, feeds = single_node_model(case, [f(2, 3)])
        expect_named_error(model, feeds, r"(?s)bad-program.*" + match)


class SwiGLU(torch.nn.Module):
    """A fused gate/up projection split in two (Phi-3's MLP, a mixture-of-experts' experts): the
    halves are views whose rows lie 2·width apart."""

    def __init__(self, hidden, width):
        super().__init__()
        self.gate_up = torch.nn.Linear(hidden, 2 * width)
        self.down = torch.nn.Linear(width, hidden)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("width", [100, 3000])  # rows shorter than a tile (tiles straddle rows), longer
def test_fused_chain_reads_row_strided_halves_in_place(strict, width):
    """The chain reads the halves where they lie (forward and backward), and its backward writes
    the two halves' gradients side by side into the projection's gradient (split_grad_join): no
    copy, no concatenation. Parity with eager over two steps."""
    torch.manual_seed(0)
    eager = SwiGLU(48, width)
    ours = ORTModule(copy.deepcopy(eager))
    x = torch.randn(3, 7, 48)
    for step in range(2):
        for m in (eager, ours):
            m.zero_grad(set_to_none=True)
        with torch.profiler.profile() as prof:
            y = ours(x)
            y.square().sum().backward()
        ye = eager(x)
        ye.square().sum().backward()
        torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-5)
        for p, e in zip(ours.module.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-5)
    assert ours.stats()["fallback"] is None
    fused = [e for e in prof.events() if e.name.startswith("torch_ort::FusedElementwise")]
    assert {e.name for e in fused} == {"torch_ort::FusedElementwise", "torch_ort::FusedElementwiseGrad"}
    copies = [e.name for e in prof.events() if e.name in ("aten::contiguous", "aten::clone", "aten::copy_")
              and any(p.name.startswith("torch_ort::FusedElementwise") for p in ancestors(e))]
    assert not copies, copies
    assert not [e for e in prof.events() if e.name in ("torch_ort::SplitGrad", "aten::cat")]
    (engine,) = next(iter(ours._plan_cache.runners()))._engines.values()
    grads = [n for n in onnx.load_from_string(engine.training_graph_onnx()).graph.node
             if n.op_type == "FusedElementwiseGrad"]
    assert [[a.ints for a in n.attribute if a.name == "join"] for n in grads] == [[[0, 1]]]


def ancestors(event):
    p = event.cpu_parent
    while p is not None:
        yield p
        p = p.cpu_parent
