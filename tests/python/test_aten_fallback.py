"""The ATen fallback: ops the exporter cannot lower, or that our engine has no kernel or gradient
rule for, train through com.torch_ort::ATenOp nodes inside our graph (FALLBACK_DISABLE: nothing
runs in eager), with eager parity, at most one re-export per round of ops the export itself could
not route, and an INFO line naming each op."""
import logging

import pytest
import torch
import torch.nn.functional as F

from conftest import twin
from torch_ort import DebugOptions, LogLevel, ORTModule, _C
from torch_ort.ortmodule.export.aten_routing import ops_from_engine_error
from torch_ort.ortmodule.export.exporter import export_module
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleONNXModelException
from torch_ort.ortmodule.export.translations.aten_op import qualified_name

KERNELS = set(_C.kernel_ops())
GRADIENTS = set(_C.gradient_ops())
LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def info_log():
    """What the torch_ort logger emits during the test (one handler on it, none on the root)."""
    logger, handler = logging.getLogger("torch_ort"), _Collect()
    logger.addHandler(handler)
    try:
        yield lambda: list(handler.messages)
    finally:
        logger.removeHandler(handler)


def fallback_lines(messages):
    return [m for m in messages if m.startswith("ATen fallback:")]


def train_with_parity(model_cls, make_inputs, steps=4, sizes=(5, 7, 6, 8), prepare=None):
    """Trains eager and ORTModule twins side by side; losses and gradients must match."""
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped, DebugOptions(log_level=LogLevel.INFO))
    if prepare:
        prepare(ours)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        inputs = make_inputs(sizes[step % len(sizes)], gen)
        outs = []
        for model, opt in ((eager, opt_e), (ours, opt_o)):
            opt.zero_grad()
            out = model(*inputs)
            loss = out[0] if isinstance(out, tuple) else out
            loss.backward()
            outs.append(out)
        loss_e, loss_o = (o[0] if isinstance(o, tuple) else o for o in outs)
        torch.testing.assert_close(loss_o, loss_e, **LOSS_TOL, msg=lambda m: f"step {step} loss: {m}")
        for (name, pe), po in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(po.grad, pe.grad, **GRAD_TOL,
                                       msg=lambda m: f"step {step} {name}.grad: {m}")
        opt_e.step()
        opt_o.step()
    return ours, outs


def rows(n, gen, d=6):
    return (torch.randn(n, d, generator=gen),)


class Untranslatable(torch.nn.Module):
    """digamma and polygamma(n, x) (an int before the tensor): the exporter has no translation."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        h = self.fc(x)
        return torch.digamma(h.exp() + 1).mean() + torch.special.polygamma(1, h.sigmoid() + 0.5).mean()


class NoKernel(torch.nn.Module):
    """pixel_shuffle lowers to ONNX DepthToSpace, which our engine has no kernel for."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)

    def forward(self, x):
        return F.pixel_shuffle(self.fc(x).reshape(-1, 8, 1, 1), 2).pow(2).mean()


class NoGradientRule(torch.nn.Module):
    """abs lowers to ONNX Abs: our engine has its kernel but no gradient rule."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        return torch.abs(self.fc(x)).mean()


# exports: pixel_shuffle is routed while the one export translates it (its translation emits
# DepthToSpace);
# digamma and polygamma reach translation as prims ops (the exporter decomposes what it has no
# translation for before translating), so the failed export finds them and one more routes them;
# a missing gradient rule is known only once the engine is built, which then re-exports once.
@pytest.mark.parametrize("model_cls, ops, why, exports", [
    (Untranslatable, ["aten::digamma.default", "aten::polygamma.default"], "no ONNX translation", 2),
    (NoKernel, ["aten::pixel_shuffle.default"], "no kernel for ONNX DepthToSpace", 1),
    (NoGradientRule, ["aten::abs.default"], "no gradient rule for ONNX Abs", 2),
])
def test_unsupported_op_trains_through_aten_node(strict, info_log, model_cls, ops, why, exports):
    # The premises, so that a kernel or rule added later turns this into a clear message.
    assert "::DepthToSpace" not in KERNELS, "DepthToSpace has a kernel now: pick another op for NoKernel"
    assert "::Abs" in KERNELS and "::Abs" not in GRADIENTS, "pick another op for NoGradientRule"
    ours, _ = train_with_parity(model_cls, rows)
    assert ours.export_count == exports, "then no more exports, however many steps"
    lines = fallback_lines(info_log())
    for op in ops:
        assert any(op in line and why in line for line in lines), (op, lines)
    assert len(lines) == len(ops), lines


class ShuffleTwice(torch.nn.Module):
    """Two pixel_shuffle nodes: the first one's translation finds DepthToSpace without a kernel."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.fc(x)
        return (F.pixel_shuffle(h.reshape(-1, 4, 1, 1), 2).pow(2).mean()
                + F.pixel_shuffle((h * 2).reshape(-1, 4, 1, 1), 2).mean())


def test_every_node_of_a_routed_op_is_routed_in_the_same_export(strict, info_log):
    """Once the first node routes pixel_shuffle, later nodes of the op take ATenOp too (the export's
    translation table was fixed before): one export, one INFO line, eager parity."""
    ours, _ = train_with_parity(ShuffleTwice, rows, steps=2)
    assert ours.export_count == 1
    assert len(fallback_lines(info_log())) == 1


class ReflectPad(torch.nn.Module):
    """F.pad(mode='reflect') lowers to ONNX Pad, whose gradient rule takes constant mode only."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        return F.pad(self.fc(x).unsqueeze(1), (1, 1), mode="reflect").pow(2).mean()


# (op_type, missing) per node the engine refuses. In training the gradient is built before
# kernels are looked up, so DepthToSpace is first refused for its missing gradient rule.
@pytest.mark.parametrize("model_cls, training, refused", [
    (NoKernel, False, [("DepthToSpace", "kernel")]),
    (NoKernel, True, [("DepthToSpace", "gradient rule")]),
    (NoGradientRule, True, [("Abs", "gradient rule")]),
    (ReflectPad, True, [("Pad", "working gradient rule")]),
])
def test_engine_reports_unsupported_nodes_as_data(model_cls, training, refused):
    """The engine's refusal names its nodes as data (.unsupported: node, domain, op_type,
    missing), which the ATen fallback maps to ATen overloads without reading the message."""
    result = export_module(model_cls(), (torch.randn(3, 6),), {}, None)
    with pytest.raises((_C.UnsupportedOpError, _C.GradientError)) as info:
        _C.Engine(result.onnx_bytes, training, [False] + [True] * len(result.param_names))
    assert isinstance(info.value, _C.UnsupportedOpError if refused[0][1] == "kernel" else _C.GradientError)
    rows = info.value.unsupported
    assert [(op_type, missing) for _, _, op_type, missing in rows] == refused
    graph_nodes = {n.name: n for n in result.raw_model[0].graph}
    for node, domain, op_type, _ in rows:
        assert node in graph_nodes and graph_nodes[node].op_type == op_type and domain == ""
    found = {qualified_name(op): why for op, why in ops_from_engine_error(result, info.value).items()}
    assert list(found.values()) == [f"our engine has no {missing} for ONNX {op}" for op, missing in refused]


def test_unsupported_nodes_reach_the_user_with_the_fallback_off(strict, monkeypatch):
    """ORTMODULE_ATEN_FALLBACK=0: the build error stays the cause of the ORTModule error, data
    included; other engine errors carry no nodes."""
    monkeypatch.setenv("ORTMODULE_ATEN_FALLBACK", "0")
    with pytest.raises(ORTModuleONNXModelException, match="No gradient rule for op 'Abs'") as info:
        ORTModule(NoGradientRule())(torch.randn(3, 6))
    cause = info.value.__cause__
    assert isinstance(cause, _C.GradientError)
    assert [(op, missing) for _, _, op, missing in cause.unsupported] == [("Abs", "gradient rule")]
    assert _C.GradientError("raised by hand").unsupported == []


class MultiOutput(torch.nn.Module):
    """cummax -> (values, int64 indices), returned as a second output; kthvalue with k traced from
    the batch size (a SymInt argument, new every step); linalg.qr -> (Q, R), both differentiated."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.fc(x)
        values, indices = torch.cummax(h, dim=0)
        kth, _ = torch.kthvalue(h, h.shape[0] // 2 + 1, dim=0, keepdim=True)
        q, r = torch.linalg.qr(h)
        return values.pow(2).mean() + kth.sum() + q.sum() + r.pow(2).mean(), indices


def test_multiple_outputs(strict, info_log):
    ours, (eager_out, ours_out) = train_with_parity(MultiOutput, rows)
    assert ours_out[1].dtype == torch.int64 and not ours_out[1].requires_grad
    torch.testing.assert_close(ours_out[1], eager_out[1], rtol=0, atol=0)
    lines = fallback_lines(info_log())
    for op in ("aten::cummax.default", "aten::kthvalue.default", "aten::linalg_qr.default"):
        assert any(op in line for line in lines), (op, lines)


class ScalarAndListArgs(torch.nn.Module):
    """cdist with p=1.5 (a float) and compute_mode=None; F.fold, whose ONNX Col2Im has no kernel
    of ours, carries int lists (output_size, kernel_size, dilation, padding, stride)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 32)

    def forward(self, x, y):
        a, b = self.fc(x), self.fc(y)
        dist = torch.cdist(a, b, p=1.5)
        folded = F.fold(a.reshape(-1, 8, 4), output_size=(3, 3), kernel_size=(2, 2))  # (B, 2, 3, 3)
        return dist.mean() + folded.pow(2).mean()


def test_scalar_and_list_arguments(strict, info_log):
    assert "::Col2Im" not in KERNELS, "Col2Im has a kernel now: pick another list-argument op"
    ours, _ = train_with_parity(ScalarAndListArgs, lambda n, gen: (torch.randn(n, 6, generator=gen),
                                                                     torch.randn(n + 2, 6, generator=gen)))
    lines = fallback_lines(info_log())
    assert any("aten::_cdist_forward.default" in line for line in lines), lines
    assert any("aten::col2im.default" in line and "Col2Im" in line for line in lines), lines


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inference(strict, context):
    eager, wrapped = twin(Untranslatable)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(1)
    for mode in ("eval", "train"):  # eval: the inference path; train under no_grad: the same engine
        getattr(eager, mode)()
        getattr(ours, mode)()
        for n in (3, 9):
            x = torch.randn(n, 6, generator=gen)
            with context():
                torch.testing.assert_close(ours(x), eager(x), **LOSS_TOL)


def test_known_ops_are_remembered_across_exports(strict, info_log):
    """A new export (here: eval mode) starts from the ops found before: one export, no new lines."""
    ours, _ = train_with_parity(NoKernel, rows, steps=2)
    exports, lines = ours.export_count, len(fallback_lines(info_log()))
    ours.eval()
    with torch.no_grad():
        ours(torch.randn(4, 6))
    assert ours.export_count == exports + 1
    assert len(fallback_lines(info_log())) == lines


def test_two_forwards_one_backward(strict):
    """Each forward keeps its own autograd state for its ATen nodes (gradient accumulation)."""
    eager, wrapped = twin(NoKernel)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(2)
    x1, x2 = torch.randn(3, 6, generator=gen), torch.randn(5, 6, generator=gen)
    for model in (eager, ours):
        (model(x1) + 2 * model(x2)).backward()
    for pe, po in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(po.grad, pe.grad, **GRAD_TOL)


def test_training_graph_holds_aten_nodes(strict):
    """The ops run inside our graph (not an eager fallback): ATenOp forward, ATenOpGrad backward."""
    import onnx

    ours = ORTModule(NoKernel())
    ours(torch.randn(3, 6)).backward()
    (runner,) = ours._plan_cache.runners()
    (engine,) = runner._engines.values()
    ops = [(n.domain, n.op_type) for n in onnx.load_from_string(engine.training_graph_onnx()).graph.node]
    assert ("com.torch_ort", "ATenOp") in ops and ("com.torch_ort", "ATenOpGrad") in ops
    assert ("", "DepthToSpace") not in ops


class EveryArgumentKind(torch.nn.Module):
    """Ops the exporter could lower, forced onto the ATen path to exercise the argument encoding:
    wrapped numbers (x * 3), a float plus an int alpha, int lists (roll), optional Scalars left
    None (clamp), and new_zeros: a size list with a traced batch dim plus dtype/layout/device."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.fc(x)
        h = torch.ops.aten.add.Tensor(h * 3, 0.5, alpha=2)
        h = torch.roll(h, shifts=[1, -1], dims=[0, 1]).clamp(min=-1.0)
        zeros = h.new_zeros(h.shape[0], 4, dtype=torch.float64, layout=torch.strided, device=h.device)
        return (h + zeros).pow(2).mean()


FORCED = [torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.roll.default,
          torch.ops.aten.clamp.default, torch.ops.aten.new_zeros.default]


def test_every_argument_kind_round_trips(strict):
    def force(ours):
        ours._aten_fallback.add({op: "forced by the test" for op in FORCED})

    ours, _ = train_with_parity(EveryArgumentKind, rows, prepare=force)
    assert ours.export_count == 1
    (runner,) = ours._plan_cache.runners()
    graph = runner.export.raw_model[0].graph
    routed = {n.attributes["aten_op"].value for n in graph if n.op_type == "ATenOp"}
    assert routed == {"aten::mul.Tensor", "aten::add.Tensor", "aten::roll.default",
                      "aten::clamp.default", "aten::new_zeros.default"}, routed
