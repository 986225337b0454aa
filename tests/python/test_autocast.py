"""Mixed precision through ORTModule: torch.autocast around the forward exports autocast's casts into
the graph (lower-precision matmuls and convolutions, fp32 losses), the engine runs that graph as it
is (its kernels with autocast off), the backward follows the graph's dtypes, user Functions see the
call's autocast state, and a model converted to bf16 trains. Eager autocast is the oracle.

Tolerances (bf16): per-step losses rtol 1e-2; gradients and activations rtol 1.6e-2 (torch's bf16
default) with atol 1.6e-2 x the largest of them (the exporter decomposes some fused eager kernels,
e.g. attention, into ops that each round to bf16: single-ulp differences)."""
import copy
import math

import onnx
import pytest
import torch
import torch.nn.functional as F

import model_zoo
from conftest import MLPClassifier, classifier_batch, twin
from torch_ort import DebugOptions, ORTModule

LOSS_RTOL = 1e-2
BF16_RTOL = 1.6e-2
BF16, FLOAT = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT


def autocast(enabled=True):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def grads_of(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_bf16_close(ours: dict, eager: dict, where: str):
    """Tensors by name: same dtypes, values within bf16 rounding of the largest of them."""
    assert ours.keys() == eager.keys(), f"{where}: different tensors"
    scale = max(t.float().abs().max().item() for t in eager.values())
    for name, e in eager.items():
        assert ours[name].dtype == e.dtype, f"{where}, {name}: {ours[name].dtype} vs {e.dtype}"
        torch.testing.assert_close(ours[name].float(), e.float(), rtol=BF16_RTOL, atol=BF16_RTOL * scale,
                                   msg=lambda m: f"{where}, {name}: {m}")


def train_twins(eager, ours, make_batch, steps, use_autocast, grad_steps=(0,)):
    """AdamW side by side; losses must agree every step, gradients at `grad_steps`; nothing
    re-exports after the first step (which may take ATen-fallback rounds)."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        args, kwargs = make_batch(4, 16, gen)
        results = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad(set_to_none=True)
            with autocast(use_autocast):
                loss = model_zoo.loss_of(model(*args, **kwargs))
            loss.backward()
            results.append((loss.item(), grads_of(model)))
            opt.step()
        (loss_e, grads_e), (loss_o, grads_o) = results
        assert math.isfinite(loss_o), f"step {step}: loss {loss_o}"
        assert loss_o == pytest.approx(loss_e, rel=LOSS_RTOL), f"step {step}: {loss_o} vs {loss_e}"
        if step in grad_steps:
            assert_bf16_close(grads_o, grads_e, f"step {step}")
        if step == 0:
            first_exports = ours.export_count
        losses.append(loss_o)
    assert ours.export_count == first_exports
    return losses


def zoo_twins(name, dtype=None, debug=None):
    factory, make_batch = model_zoo.ZOO[name]
    torch.manual_seed(0)
    eager = factory() if dtype is None else factory().to(dtype)
    return eager, ORTModule(copy.deepcopy(eager), debug), make_batch


@pytest.mark.parametrize("name", ["gpt2", "bert_mlm"])
def test_zoo_model_trains_under_bf16_autocast_like_eager(strict, tmp_path, monkeypatch, name):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    eager, ours, make_batch = zoo_twins(name, debug=DebugOptions(save_onnx=True, onnx_prefix=name))
    losses = train_twins(eager, ours, make_batch, steps=20, use_autocast=True, grad_steps=(0, 19))
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    assert all(p.grad.dtype == torch.float32 for p in ours.parameters())  # fp32 master weights
    assert_autocast_policy(onnx.load(str(tmp_path / f"{name}_optimized_pre_grad_training.onnx")).graph)


def assert_autocast_policy(graph):
    """CPU autocast's policy, as the engine's graph carries it: matmuls in bf16, the loss in fp32
    (cross_entropy is on autocast's fp32 list)."""
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    matmuls = [n for n in graph.node if n.op_type in ("MatMul", "Gemm", "FusedMatMul")]
    assert len(matmuls) >= 4 * model_zoo.LAYERS
    for node in matmuls:
        assert [types[v] for v in node.input] == [BF16] * len(node.input), node.name
    losses = [n for n in graph.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    assert len(losses) == 1 and types[losses[0].input[0]] == FLOAT


class MixedNet(torch.nn.Module):
    """Autocast-eligible Linear layers, and a product the model keeps in fp32 by switching autocast
    off: run under autocast, the engine must not cast it down again."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x, labels):
        h = torch.relu(self.fc1(x))
        with torch.autocast("cpu", enabled=False):
            gram = h.float() @ h.float().t()
        return F.cross_entropy(self.fc2(h), labels) + 1e-3 * gram.sum(), h, gram


def test_autocast_state_selects_the_graph(strict):
    """Off, on, off again (training and no_grad): each way equal to eager; two exports."""
    eager, ours = twin(MixedNet)
    ours = ORTModule(ours)
    x, labels = torch.randn(5, 8), torch.randint(0, 4, (5,))
    for enabled in (False, True, False, True):
        results = []
        for model in (eager, ours):
            model.zero_grad(set_to_none=True)
            with autocast(enabled):
                loss, h, gram = model(x, labels)
            loss.backward()
            with torch.no_grad(), autocast(enabled):
                inferred = model(x, labels)[1]
            results.append(((loss, h, gram, inferred), grads_of(model)))
        (out_e, grads_e), (out_o, grads_o) = results
        expected = [torch.float32, torch.bfloat16 if enabled else torch.float32, torch.float32]
        assert [t.dtype for t in out_o[:3]] == expected, f"autocast {enabled}"
        for o, e in zip(out_o, out_e):
            assert o.dtype == e.dtype
            torch.testing.assert_close(o, e, msg=lambda m: f"autocast {enabled}: {m}")
        assert_bf16_close(grads_o, grads_e, f"autocast {enabled}")
    assert ours.export_count == 2


def test_cuda_autocast_gets_cpu_autocasts_float32_rule_for_cross_entropy_while_exporting():
    """Eager under CUDA autocast runs F.cross_entropy as its decomposition (log_softmax and nll_loss
    in float32): the loss is float32 although the logits are bf16. CUDA autocast has no rule for the
    op itself, so a trace kept it whole in bf16; while an export traces under CUDA autocast the op
    gets CPU autocast's rule (inputs to float32), and only then. (The dtype on a GPU:
    tests/python/test_gpu_parity.py.)"""
    from torch_ort.ortmodule.export import autocast

    def registered():
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::cross_entropy_loss", "AutocastCUDA")

    assert not registered()
    cuda = (("cuda", torch.bfloat16),)
    with autocast._cuda_autocast_float32_losses(cuda):
        assert registered()
        with autocast._cuda_autocast_float32_losses(cuda):  # a nested export
            assert registered()
        assert registered()
    assert not registered()
    with autocast._cuda_autocast_float32_losses((("cpu", torch.bfloat16),)):
        assert not registered()  # CPU autocast has its own rule

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, 3, generator=gen).to(torch.bfloat16)
    labels, weight = torch.randint(0, 5, (6, 3), generator=gen), torch.rand(5, generator=gen)
    probs = torch.softmax(torch.randn(6, 5, 3, generator=gen), 1).to(torch.bfloat16)
    for target, kw in ((labels, {}), (labels, dict(label_smoothing=0.1)), (probs, {})):
        got = autocast.float32_cross_entropy(logits, target, weight.to(torch.bfloat16), 1, -100,
                                             kw.get("label_smoothing", 0.0))
        want = F.cross_entropy(logits.float(), target.float() if target.is_floating_point() else target,
                               weight.to(torch.bfloat16).float(), **kw)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x, labels):
        h = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return F.cross_entropy(self.head(h), labels), h


def test_conv_batchnorm_trains_under_bf16_autocast_like_eager(strict):
    """Convolutions in bf16; BatchNorm's running statistics (fp32 buffers) as eager's."""
    eager, ours = twin(ConvNet)
    ours = ORTModule(ours)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        x, labels = torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 5, (4,), generator=gen)
        results = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss, h = model(x, labels)
            loss.backward()
            results.append((loss.item(), h, grads_of(model)))
            opt.step()
        (loss_e, h_e, grads_e), (loss_o, h_o, grads_o) = results
        assert h_o.dtype == h_e.dtype == torch.bfloat16
        assert loss_o == pytest.approx(loss_e, rel=LOSS_RTOL), f"step {step}"
        assert_bf16_close(grads_o, grads_e, f"step {step}")
    for (name, b_o), b_e in zip(ours.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b_o, b_e, msg=lambda m: f"{name}: {m}")


SEEN = []


class RecordingMatMul(torch.autograd.Function):
    """Records the autocast state its forward and backward run under; its product is autocast."""

    @staticmethod
    def forward(ctx, x, w):
        SEEN.append(("forward", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        SEEN.append(("backward", torch.is_autocast_enabled("cpu"), g.dtype))
        x, w = ctx.saved_tensors
        return (g @ w.t().to(g.dtype)).to(x.dtype), (x.t().to(g.dtype) @ g).to(w.dtype)


class FunctionNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.w = torch.nn.Parameter(torch.randn(16, 4))

    def forward(self, x):
        h = RecordingMatMul.apply(torch.tanh(self.fc(x)), self.w)
        return h.float().pow(2).mean(), h


@pytest.mark.parametrize("backward_inside", [False, True], ids=["backward_after", "backward_inside"])
def test_python_op_sees_the_callers_autocast_state(strict, backward_inside):
    eager, ours = twin(FunctionNet)
    ours = ORTModule(ours)
    x = torch.randn(5, 8)
    with autocast():
        ours(x)  # the export runs the Function once
    seen = []
    for model in (eager, ours):
        SEEN.clear()
        model.zero_grad(set_to_none=True)
        with autocast():
            loss, h = model(x)
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        assert h.dtype == torch.bfloat16
        seen.append((list(SEEN), loss, grads_of(model)))
    (seen_e, loss_e, grads_e), (seen_o, loss_o, grads_o) = seen
    assert seen_o == seen_e == [("forward", True, torch.bfloat16),
                                ("backward", backward_inside, torch.bfloat16)]
    torch.testing.assert_close(loss_o, loss_e)
    assert_bf16_close(grads_o, grads_e, "step 0")


def test_bf16_mlp_trains_like_eager(strict):
    """Converted after its first fp32 call: the new parameter dtype re-exports."""
    eager, ours = twin(MLPClassifier)
    ours = ORTModule(ours)
    x, labels = classifier_batch(8, gen=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(x, labels)[0], eager(x, labels)[0])
    eager.to(torch.bfloat16)
    ours.to(torch.bfloat16)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    for step in range(10):
        x, labels = classifier_batch(8, gen=gen)
        results = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad(set_to_none=True)
            loss, logits = model(x.bfloat16(), labels)
            loss.backward()
            results.append((loss, logits, grads_of(model)))
            opt.step()
        (loss_e, logits_e, grads_e), (loss_o, logits_o, grads_o) = results
        assert loss_o.dtype == logits_o.dtype == torch.bfloat16
        assert loss_o.item() == pytest.approx(loss_e.item(), rel=LOSS_RTOL), f"step {step}"
        torch.testing.assert_close(logits_o, logits_e)
        assert_bf16_close(grads_o, grads_e, f"step {step}")
    assert ours.export_count == 2
    for p_o, p_e in zip(ours.parameters(), eager.parameters()):
        assert p_o.dtype == torch.bfloat16
        torch.testing.assert_close(p_o, p_e)


def test_bf16_zoo_model_trains_like_eager(strict):
    eager, ours, make_batch = zoo_twins("nanogpt", torch.bfloat16)
    losses = train_twins(eager, ours, make_batch, steps=6, use_autocast=False, grad_steps=(0, 5))
    assert sum(losses[-2:]) < sum(losses[:2])
    assert all(p.grad.dtype == torch.bfloat16 for p in ours.parameters())
