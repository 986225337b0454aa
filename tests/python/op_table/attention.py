"""The attention family (csrc/core/ops/attention.cc): Attention and AttentionGrad."""
import torch
import torch.nn.functional as F

from op_table import Case, OURS, f  # noqa: F401


SCALE = 0.35


_q, _k, _v = f(2, 3, 5, 8), f(2, 3, 7, 8), f(2, 3, 7, 8)  # cross attention: L = 5, S = 7


_mask4, _mask2 = f(2, 1, 5, 7), f(5, 7)


_kv_one_head = f(2, 1, 7, 8)


# Grouped-query attention: K and V of 2 heads for Q's 4 (query head h reads KV head h // 2).
_qg, _kg, _vg = f(2, 4, 5, 8), f(2, 2, 7, 8), f(2, 2, 7, 8)


def acc(t):  # the kernels' accumulation type: double for double, float otherwise
    return t.double() if t.dtype == torch.float64 else t.float()


def heads_of(q, t):
    """K or V with each of its heads repeated to Q's (grouped-query attention); as it is when its
    head count is Q's or 1 (broadcast)."""
    n = q.shape[1] // t.shape[1]
    return t if t.shape[1] in (1, q.shape[1]) else t.repeat_interleave(n, 1)


def grouped(q, k):
    return k.shape[1] not in (1, q.shape[1])


def scores(q, k, mask=None, causal=False, scale=SCALE):
    s = (acc(q) @ acc(heads_of(q, k)).transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s if mask is None else s + acc(mask)


def attention(causal=False, scale=SCALE, math=False):
    """(Y, LogSumExp) of softmax(scale·Q·Kᵀ + mask)·V; math=True spells it out (no SDPA path
    broadcasts heads)."""
    def ref(q, k, v, mask=None):
        s = scores(q, k, mask, causal, scale)
        if math:
            y = (torch.softmax(s, -1) @ acc(heads_of(q, v))).to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                               enable_gqa=grouped(q, k))
        return y, torch.logsumexp(s, -1)
    return ref


def sdpa_choice(q, k, v, mask=None, causal=False, scale=SCALE):
    """The backend eager SDPA picks for a training step on these tensors (torch.nn.attention's
    SDPBackend value: 0 math, 1 flash, 2 efficient, 3 cuDNN)."""
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        return torch.tensor(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=scale))


def attention_with_backend(causal=False, mask_shape=None):
    """(Y, LogSumExp, Backend): the recorded choice is SDPA's own."""
    def ref(q, k, v, mask=None):
        y, lse = attention(causal)(q, k, v, mask)
        m = None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        return y, lse, sdpa_choice(q, k, v, m, causal)
    return ref


def attention_dropout(p, causal=False):
    """(Y, LogSumExp, Backend, RngState0, RngState1) of eager SDPA with dropout, seeded: on the CPU
    the kernel draws as eager's math path does (from the generator whose state it returns)."""
    def ref(q, k, v):
        state = torch.get_rng_state()
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=SCALE)
        lse = torch.logsumexp(scores(q, k, None, causal), -1)
        return y, lse, torch.tensor(0), state, torch.empty(0, dtype=torch.int64)  # math: SDPBackend 0
    return ref


def attention_grad(causal=False, scale=SCALE):
    """(dQ, dK, dV) of SDPA by autograd; Y and LogSumExp inputs come from the forward."""
    def ref(dy, q, k, v, y, lse, mask=None):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, heads_of(q, k), heads_of(q, v), attn_mask=mask, is_causal=causal,
                                             scale=scale)
        return torch.autograd.grad(out, (q, k, v), dy)
    return ref


def grad_inputs(q, k, v, mask=None, causal=False):
    y, lse = attention(causal)(q, k, v, mask)
    return [f(*y.shape), q, k, v, y.detach(), lse.detach()] + ([mask] if mask is not None else [])


def attrs(causal=False, scale=SCALE):
    return dict(causal=int(causal), scale=scale)


_q5, _k5, _v5 = f(2, 3, 5, 8), f(2, 3, 5, 8), f(2, 3, 5, 8)


CASES = [
    Case("Attention", [_q5, _k5, _v5], attention(causal=True), attrs(True), domain=OURS, n_out=2,
         id="Attention-causal"),
    Case("Attention", [_q, _k, _v, _mask4], attention(), attrs(), domain=OURS, n_out=2, id="Attention-mask-4d-cross"),
    Case("Attention", [_q, _k, _v, _mask2], attention(), attrs(), domain=OURS, n_out=2, id="Attention-mask-2d"),
    Case("Attention", [t.double() for t in (_q5, _k5, _v5)], attention(causal=True), attrs(True), domain=OURS,
         n_out=2, id="Attention-causal-f64"),
    Case("Attention", [t.half() for t in (_q5, _k5, _v5)], attention(causal=True), attrs(True), domain=OURS,
         n_out=2, id="Attention-causal-f16"),
    Case("Attention", [_q5, _k5, _v5], attention(causal=True, scale=8 ** -0.5), dict(causal=1), domain=OURS, n_out=2,
         id="Attention-default-scale"),
    Case("Attention", [_q, _k, f(2, 3, 7, 4)], attention(), attrs(), domain=OURS, n_out=2,
         id="Attention-math-value-head-size"),
    Case("Attention", [_q, _kv_one_head, _kv_one_head, _mask4], attention(math=True), attrs(), domain=OURS, n_out=2,
         id="Attention-one-kv-head-mask"),
    # Dropout: eager's draws (seeded), and the backward (test_op_gradients.py) replays them from the
    # returned generator state, against autograd through eager's own mask.
    Case("Attention", [_q5, _k5, _v5], attention_dropout(0.3, causal=True), dict(attrs(True), dropout=0.3),
         domain=OURS, n_out=5, seed=11, id="Attention-dropout-seeded"),
    # Grouped K and V: flash takes them as they are; the math path (V's head size unlike Q's)
    # repeats them and sums the repeated heads' gradients.
    Case("Attention", [_qg, _kg, _vg], attention(causal=True), attrs(True), domain=OURS, n_out=2,
         id="Attention-grouped-causal"),
    Case("Attention", [_qg, _kg, _vg, _mask4], attention(), attrs(), domain=OURS, n_out=2, id="Attention-grouped-mask"),
    Case("Attention", [_qg, _kg, f(2, 2, 7, 4)], attention(math=True), attrs(), domain=OURS, n_out=2,
         id="Attention-grouped-math"),
    Case("AttentionGrad", grad_inputs(_qg, _kg, _vg, causal=True), attention_grad(causal=True), attrs(True),
         domain=OURS, n_out=3, id="AttentionGrad-grouped-causal"),
    Case("AttentionGrad", grad_inputs(_qg, _kg, f(2, 2, 7, 4), _mask2), attention_grad(), attrs(), domain=OURS,
         n_out=3, id="AttentionGrad-grouped-math"),
    Case("AttentionGrad", grad_inputs(_q5, _k5, _v5, causal=True), attention_grad(causal=True), attrs(True),
         domain=OURS, n_out=3, id="AttentionGrad-causal"),
    Case("AttentionGrad", grad_inputs(_q, _k, _v, _mask4), attention_grad(), attrs(), domain=OURS, n_out=3,
         id="AttentionGrad-mask-4d-cross"),
    Case("AttentionGrad", grad_inputs(_q, _k, f(2, 3, 7, 4), _mask2), attention_grad(), attrs(), domain=OURS, n_out=3,
         id="AttentionGrad-math-value-head-size"),
    # The forward records SDPA's choice; the backward runs what it names (here: flash, then math).
    Case("Attention", [_q5, _k5, _v5], attention_with_backend(causal=True), attrs(True), domain=OURS, n_out=3,
         id="Attention-records-the-backend"),
    Case("Attention", [_q, _k, _v, _mask4], attention_with_backend(), attrs(), domain=OURS, n_out=3,
         id="Attention-records-the-backend-mask"),
    Case("AttentionGrad", grad_inputs(_q5, _k5, _v5, causal=True) + [None, None, torch.tensor(1)],
         lambda *a: attention_grad(causal=True)(*a[:6]), attrs(True), domain=OURS, n_out=3,
         id="AttentionGrad-flash-recorded"),
    Case("AttentionGrad", grad_inputs(_q, _k, _v, _mask4) + [None, torch.tensor(0)],
         lambda *a: attention_grad()(*a[:7]), attrs(), domain=OURS, n_out=3, id="AttentionGrad-math-recorded"),
]
