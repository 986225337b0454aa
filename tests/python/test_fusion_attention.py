"""attention_fusion on real exports: the pass fires on every attention layer of nanoGPT
(F.scaled_dot_product_attention(is_causal=True)), Hugging Face GPT-2 and BERT (SDPA with a padding
mask), in training and in eval, and with attention dropout in training (the kernel draws it:
test_attention_dropout.py); and training through the fused Attention/AttentionGrad keeps parity
with eager PyTorch and with the same engine with the pass disabled (losses and gradients).

Tolerances as tests/python/test_models.py (fp32): losses rtol 1e-4, gradients rtol 1e-3 / atol 1e-5."""
import copy
import math

import onnx
import pytest
import torch

import model_zoo
from test_models import LOSS_RTOL, assert_grads_close, train_step
from torch_ort import ORTModule

# model -> is_causal (nanoGPT's SDPA) or a padding mask input (HF's SDPA attention)
MODELS = {"nanogpt": True, "gpt2": False, "bert_cls": False}


def engine_of(ours):
    runner = next(iter(ours._plan_cache.runners()))
    return next(iter(runner._engines.values()))


def forward_ops(ours):
    return onnx.load_from_string(engine_of(ours).forward_graph_onnx()).graph.node


def training_op_count(ours, op):
    return sum(n.op_type == op for n in onnx.load_from_string(engine_of(ours).training_graph_onnx()).graph.node)


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def one_step(ours, name, train=True):
    args, kwargs = model_zoo.ZOO[name][1](4, 16, torch.Generator().manual_seed(0))
    if train:
        model_zoo.loss_of(ours(*args, **kwargs)).backward()
    else:
        with torch.no_grad():
            ours(*args, **kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_fires_on_every_attention_layer(strict, name):
    torch.manual_seed(0)
    ours = ORTModule(model_zoo.ZOO[name][0]())
    one_step(ours, name)
    nodes = forward_ops(ours)
    att = [n for n in nodes if n.op_type == "Attention"]
    assert len(att) == model_zoo.LAYERS
    assert not any(n.op_type == "Softmax" for n in nodes)  # no attention left unfused
    head = model_zoo.WIDTH // model_zoo.HEADS
    for n in att:
        assert n.domain == "com.torch_ort"
        assert attrs(n)["causal"] == int(MODELS[name])
        assert len(n.input) == (3 if MODELS[name] else 4)  # causal: no mask tensor at all
        assert attrs(n)["scale"] == pytest.approx(1 / math.sqrt(head), rel=1e-7)
    assert training_op_count(ours, "AttentionGrad") == model_zoo.LAYERS


@pytest.mark.parametrize("name", ["gpt2", "bert_cls"])
def test_fires_in_eval_export_even_with_dropout_configured(strict, name):
    torch.manual_seed(0)
    ours = ORTModule(model_zoo.ZOO[name][0](dropout=0.1)).eval()
    one_step(ours, name, train=False)
    assert sum(n.op_type == "Attention" for n in forward_ops(ours)) == model_zoo.LAYERS


@pytest.mark.parametrize("name", ["gpt2", "bert_cls"])
def test_fires_with_attention_dropout_in_training(strict, name):
    """HF's default attention dropout (0.1 here) in train mode: every layer's Softmax → Dropout →
    MatMul is one Attention carrying the rate, whose gradient replays the forward's random state;
    training runs (seeded parity with eager through it: test_models.py's dropout test)."""
    torch.manual_seed(0)
    ours = ORTModule(model_zoo.ZOO[name][0](dropout=0.1))
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        args, kwargs = model_zoo.ZOO[name][1](4, 16, gen)
        _, loss, _ = train_step(ours, opt, args, kwargs)
        assert math.isfinite(loss), f"step {step}: loss {loss}"
    nodes = forward_ops(ours)
    att = [n for n in nodes if n.op_type == "Attention"]
    assert len(att) == model_zoo.LAYERS
    assert not any(n.op_type == "Softmax" for n in nodes)
    for n in att:
        assert attrs(n)["dropout"] == pytest.approx(0.1)
        assert len(n.output) == 5  # Y, LogSumExp, Backend, and the random state
    graph = onnx.load_from_string(engine_of(ours).training_graph_onnx()).graph
    grads = [n for n in graph.node if n.op_type == "AttentionGrad"]
    assert len(grads) == model_zoo.LAYERS
    assert {tuple(n.output[3:5]) for n in graph.node if n.op_type == "Attention"} == \
        {tuple(n.input[9:11]) for n in grads}


def run_twins(name, make_a, make_b, steps):
    """Trains two copies of one initial model side by side (AdamW); returns per-step losses and
    the gradients of the first and last step."""
    torch.manual_seed(0)
    base = model_zoo.ZOO[name][0]()
    a, b = make_a(copy.deepcopy(base)), make_b(copy.deepcopy(base))
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-3, weight_decay=0.01)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        args, kwargs = model_zoo.ZOO[name][1](*((4, 16), (3, 11))[step % 2], gen)
        _, loss_a, grads_a = train_step(a, opt_a, args, kwargs)
        _, loss_b, grads_b = train_step(b, opt_b, args, kwargs)
        assert math.isfinite(loss_a), f"step {step}: loss {loss_a}"
        assert loss_a == pytest.approx(loss_b, rel=LOSS_RTOL), f"step {step}: {loss_a} vs {loss_b}"
        if step in (0, steps - 1):
            assert_grads_close(grads_a, grads_b, f"step {step}")
    return a, b


@pytest.mark.parametrize("name", MODELS)
def test_training_matches_eager(strict, name):
    ours, _ = run_twins(name, ORTModule, lambda m: m, steps=5)
    assert sum(n.op_type == "Attention" for n in forward_ops(ours)) == model_zoo.LAYERS


@pytest.mark.parametrize("name", MODELS)
def test_backward_runs_the_backend_forward_chose(strict, name):
    """Attention's third output, SDPA's choice, is a host value each AttentionGrad reads: the
    backward runs the kernel family whose LogSumExp the forward saved."""
    ours = ORTModule(model_zoo.ZOO[name][0]())
    one_step(ours, name)
    graph = onnx.load_from_string(engine_of(ours).training_graph_onnx()).graph
    att = [n for n in graph.node if n.op_type == "Attention"]
    grads = [n for n in graph.node if n.op_type == "AttentionGrad"]
    assert len(att) == len(grads) == model_zoo.LAYERS
    assert {n.output[2] for n in att} == {n.input[8] for n in grads}
    host = set(engine_of(ours).host_values())
    assert all(n.output[2] in host for n in att)


# Parity with the pass disabled: test_pass_parity.py (every pass, every zoo model).


class MaskedAttention(torch.nn.Module):
    """SDPA under a mask given as a tensor (Hugging Face materialises its causal mask so under
    export): `kind` "causal" hides the keys after each query with finfo.min, "causal_inf" with
    -inf, "padded" also hides the last three keys of the second sequence; "first_key" is a
    (B, 1, 1, S) mask that hides every key but the first from every query, "no_key" a (T, 1) zero
    mask: broadcast, neither hides only the future."""

    def __init__(self, kind, width=32, heads=4):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        if self.kind in ("first_key", "no_key"):
            hidden = torch.ones(b, 1, 1, t, dtype=torch.bool, device=x.device)
            hidden[..., 0] = False
            mask = torch.zeros(b, 1, 1, t, dtype=x.dtype, device=x.device).masked_fill(hidden, torch.finfo(x.dtype).min)
            if self.kind == "no_key":
                mask = torch.zeros(t, 1, dtype=x.dtype, device=x.device)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out(y.transpose(1, 2).reshape(b, t, w))
        hidden = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1).expand(b, 1, t, t)
        if self.kind == "padded":
            pad = torch.zeros(b, 1, 1, t, dtype=torch.bool, device=x.device)
            pad[1, ..., t - 3:] = True
            hidden = hidden | pad
        low = float("-inf") if self.kind == "causal_inf" else torch.finfo(x.dtype).min
        mask = torch.zeros(b, 1, t, t, dtype=x.dtype, device=x.device).masked_fill(hidden, low)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, w))


@pytest.mark.parametrize("kind", ["causal", "causal_inf", "padded", "first_key", "no_key"])
def test_a_mask_that_hides_only_the_future_runs_as_causal(strict, kind):
    """A mask tensor that hides exactly the later keys runs the kernel's causal form, no mask
    added (the blocks above the diagonal skipped, as eager's is_causal); any other mask is added
    as it is. Either way forward and gradients match eager's over three steps."""
    torch.manual_seed(0)
    eager = MaskedAttention(kind)
    ours = ORTModule(copy.deepcopy(eager))
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(2, 12, 32, generator=gen)
        with torch.profiler.profile(record_shapes=True) as prof:
            y = ours(x)
            (y * y).mean().backward()
        ye = eager(x)
        (ye * ye).mean().backward()
        torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")
        for (n, p), e in zip(ours.module.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"step {step} {n}: {m}")
        for opt in (opt_e, opt_o):
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert ours.stats()["fallback"] is None
    assert sum(n.op_type == "Attention" for n in forward_ops(ours)) == 1
    calls = [e for e in prof.events() if e.name.startswith("aten::_scaled_dot_product_flash_attention_for_cpu")]
    assert len(calls) == 2, [e.name for e in calls]  # forward and backward, both flash
    masks = {tuple(e.input_shapes[5] if "backward" not in e.name else e.input_shapes[8]) for e in calls}
    assert (masks == {()}) == kind.startswith("causal"), masks


class GroupedAttention(torch.nn.Module):
    """Causal SDPA with fewer K/V heads than Q heads, repeated to Q's as Hugging Face's repeat_kv
    does (`kind` "grouped": each KV head read by consecutive query heads; "grouped_dv": the same
    with V's head size unlike Q's, which no fused kernel takes) or tiled ("tiled": KV head h % 2
    for query head h, a repeat of another order, which the kernel's grouping is not)."""

    def __init__(self, kind, width=32, heads=4, kv_heads=2, head=8):
        super().__init__()
        self.kind, self.heads, self.kv_heads, self.head = kind, heads, kv_heads, head
        self.dv = 2 * head if kind == "grouped_dv" else head
        self.q = torch.nn.Linear(width, heads * head)
        self.k = torch.nn.Linear(width, kv_heads * head)
        self.v = torch.nn.Linear(width, kv_heads * self.dv)
        self.out = torch.nn.Linear(heads * self.dv, width)

    def repeat(self, x):
        b, h, t, d = x.shape
        n = self.heads // h
        if self.kind == "tiled":
            return x[:, None].expand(b, n, h, t, d).reshape(b, h * n, t, d)
        return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.dv).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# On a GPU in bf16 the fused kernel is flash attention (grouped K and V natively); in fp32 the
# memory-efficient kernel (K and V repeated inside our kernel).
@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), pytest.param("cuda", torch.float32, marks=CUDA),
                                          pytest.param("cuda", torch.bfloat16, marks=CUDA)])
@pytest.mark.parametrize("kind", ["grouped", "grouped_dv", "tiled"])
def test_attention_reads_grouped_keys_and_values_unrepeated(strict, kind, device, dtype):
    """K and V repeated head by head (repeat_kv) reach Attention unrepeated: flash attention takes
    the fewer heads itself (no (B, H, S, D) copy, no sum of the copies' gradients), and a backend
    that does not (V's head size unlike Q's: the math path) repeats them inside the kernel. A tiled
    repeat is another head order and stays in the graph. Forward and gradients match eager's over
    three steps."""
    torch.manual_seed(0)
    eager = GroupedAttention(kind).to(device, dtype)
    ours = ORTModule(copy.deepcopy(eager))
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    tol = dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=1e-3, atol=1e-4)
    if dtype == torch.bfloat16:
        tol = dict(rtol=2e-2, atol=2e-2)
    for step in range(3):
        x = torch.randn(2, 12, 32, generator=gen).to(device, dtype)
        with torch.profiler.profile(record_shapes=True) as prof:
            y = ours(x)
            (y.float() ** 2).mean().backward()
        ye = eager(x)
        (ye.float() ** 2).mean().backward()
        torch.testing.assert_close(y, ye, **tol, msg=lambda m: f"step {step}: {m}")
        for (n, p), e in zip(ours.module.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, e.grad, rtol=tol["rtol"] * 10, atol=tol["atol"],
                                       msg=lambda m: f"step {step} {n}: {m}")
        for opt in (opt_e, opt_o):
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert ours.stats()["fallback"] is None
    nodes = list(forward_ops(ours))
    made_by = {o: n.op_type for n in nodes for o in n.output}
    (att,) = [n for n in nodes if n.op_type == "Attention"]
    repeated = {made_by.get(att.input[1]), made_by.get(att.input[2])}
    assert (repeated == {"Reshape"}) == (kind == "tiled"), repeated
    assert any(n.op_type == "Expand" for n in nodes) == (kind == "tiled")
    if device != "cpu":
        return
    calls = [e for e in prof.events() if e.name.startswith("aten::_scaled_dot_product_flash_attention_for_cpu")]
    if kind == "grouped_dv":
        assert not calls, [e.name for e in calls]
    else:
        assert len(calls) == 2, [e.name for e in calls]  # forward and backward, both flash
        kv_heads = {e.input_shapes[2 if "backward" in e.name else 1][1] for e in calls}
        assert kv_heads == ({4} if kind == "tiled" else {2}), kv_heads
