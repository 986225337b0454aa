"""Attention dropout inside the fused Attention kernel (CPU): F.scaled_dot_product_attention with
dropout_p > 0 in training becomes one Attention carrying the rate. V = [I | V] makes the output
reveal the dropped probabilities (Y = [P ⊙ M/(1−p) | P ⊙ M/(1−p)·V]), so a test sees the mask M
the forward drew: it drops at the rate, keeps P/(1−p), the backward uses that very mask (gradients
equal eager autograd through the same mask), and torch.manual_seed reproduces it (the draws are
eager's own: the same seed gives eager's output). Dropout 0: gradients equal eager SDPA's.
On a CUDA GPU the same tests run the fused kernels (memory-efficient attention for fp32), whose
backward replays the forward's Philox state."""
import math

import onnx
import pytest
import torch
import torch.nn.functional as F

from torch_ort import ORTModule

P = 0.25
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA GPU"))]
TOL = {"cpu": dict(rtol=1e-5, atol=1e-6), "cuda": dict(rtol=1e-4, atol=1e-5)}  # values; gradients ×10
L, S, D, DV = 24, 24, 8, 5  # queries, keys, Q/K head size, V's own columns after the identity


class Attn(torch.nn.Module):
    """SDPA of (Q·Wᵀ, K, V): W, a parameter, also gives Q a static head size, as a model's
    projections do (the fusion proves its pattern from the shapes)."""

    def __init__(self, p):
        super().__init__()
        self.p = p
        self.wq = torch.nn.Linear(D, D, bias=False)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(self.wq(q), k, v, dropout_p=self.p if self.training else 0.0)


def fused_nodes(ours):
    """The forward graph's attention-related nodes (op type, attributes)."""
    runner = next(iter(ours._plan_cache.runners()))
    engine = next(iter(runner._engines.values()))
    graph = onnx.load_from_string(engine.forward_graph_onnx()).graph
    return [(n.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
            for n in graph.node if n.op_type in ("Attention", "Softmax", "Dropout")]


def qkv(seed, dv=DV, reveal=True, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 3, L, D, generator=g), torch.randn(2, 3, S, D, generator=g), torch.randn(2, 3, S, dv, generator=g)
    if reveal:
        v = torch.cat([torch.eye(S).expand(2, 3, S, S), v], -1)
    return q.to(device), k.to(device), v.to(device)


def step(ours, q, k, v, w, seed=None):
    """Forward and backward of sum(Y ⊙ w); returns Y and the gradients of Q, K, V and W."""
    if seed is not None:
        torch.manual_seed(seed)
    ours.module.wq.weight.grad = None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    y = ours(*leaves)
    (y * w).sum().backward()
    return y.detach(), [t.grad for t in leaves] + [ours.module.wq.weight.grad]


@pytest.mark.parametrize("device", DEVICES)
def test_drops_at_the_rate_and_scales_what_it_keeps(strict, device):
    ours = ORTModule(Attn(P).to(device))
    q, k, v = qkv(0, dv=0, device=device)  # V = I: Y is the dropped probability matrix itself
    y, _ = step(ours, q, k, v, torch.ones(2, 3, L, S, device=device), seed=0)
    ((op, at),) = fused_nodes(ours)  # no Softmax, no Dropout left
    assert op == "Attention" and at["dropout"] == P and at["causal"] == 0
    with torch.no_grad():
        probs = torch.softmax(ours.module.wq(q) @ k.transpose(-2, -1) * D ** -0.5, -1)
    dropped = y == 0
    bound = 5 * math.sqrt(P * (1 - P) / y.numel())  # 5 standard deviations of the observed rate
    assert abs(dropped.float().mean().item() - P) < bound
    torch.testing.assert_close(y[~dropped], (probs / (1 - P))[~dropped], **TOL[device])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.0, P])
def test_backward_uses_the_forward_mask(strict, p, device):
    """Gradients of Q, K, V and W equal eager autograd's through the mask the forward drew
    (p = 0: through eager F.scaled_dot_product_attention itself, the flash path)."""
    ours = ORTModule(Attn(p).to(device))
    q, k, v = qkv(1, dv=DV if p else D, reveal=p > 0, device=device)
    w = torch.randn(2, 3, L, v.shape[-1], generator=torch.Generator().manual_seed(2)).to(device)
    y, grads = step(ours, q, k, v, w, seed=3)
    ((op, at),) = fused_nodes(ours)
    assert op == "Attention" and at.get("dropout", 0.0) == pytest.approx(p)

    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    weight = ours.module.wq.weight.detach().clone().requires_grad_()
    if p:
        keep = y[..., :S] != 0  # the forward's mask
        assert 0 < keep.float().mean() < 1
        probs = torch.softmax((ref[0] @ weight.T) @ ref[1].transpose(-2, -1) * D ** -0.5, -1)
        y_ref = (probs * keep / (1 - p)) @ ref[2]
    else:
        y_ref = F.scaled_dot_product_attention(ref[0] @ weight.T, ref[1], ref[2])
    (y_ref * w).sum().backward()
    torch.testing.assert_close(y, y_ref.detach(), **TOL[device])
    tol = {k: 10 * v for k, v in TOL[device].items()}
    for name, got, want in zip(("dQ", "dK", "dV", "dW"), grads, [t.grad for t in ref] + [weight.grad]):
        torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_seed_reproduces_the_draw(strict, device):
    """The same torch.manual_seed: identical outputs and gradients, and eager's own output (the
    kernel draws from the global generator as eager does); another seed: another mask."""
    ours = ORTModule(Attn(P).to(device))
    q, k, v = qkv(4, device=device)
    w = torch.randn(2, 3, L, S + DV, generator=torch.Generator().manual_seed(5)).to(device)
    (y1, g1), (y2, g2), (y3, _) = (step(ours, q, k, v, w, seed=s) for s in (7, 7, 8))
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    assert not torch.equal(y1[..., :S] != 0, y3[..., :S] != 0)
    torch.manual_seed(7)
    with torch.no_grad():
        eager = F.scaled_dot_product_attention(ours.module.wq(q), k, v, dropout_p=P)
    torch.testing.assert_close(y1, eager, **TOL[device])
