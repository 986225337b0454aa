"""Indexing ops on real torch.onnx exports: a nanoGPT attention block (x.split -> SplitToSequence,
rewritten to Split by the sequence_to_split pass; causal mask via Trilu; positions via Range;
tied embedding via Gather) and a module of slicing/gathering ops, each run through the engine
(training) and compared with eager autograd, forward and backward, at two sequence lengths."""
import onnx
import pytest
import torch
import torch.nn.functional as F

from torch_ort import _C
from torch_ort.ortmodule.export.exporter import export_module


class QKVBlock(torch.nn.Module):
    def __init__(self, d=16, heads=2, vocab=50):
        super().__init__()
        self.d, self.h = d, heads
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(32, d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one weight gathered and multiplied

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.emb(idx) + self.pos(torch.arange(T))
        q, k, v = self.qkv(x).split(self.d, dim=2)
        q, k, v = (t.view(B, T, self.h, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        logits = self.head(x + self.proj(y.transpose(1, 2).reshape(B, T, -1)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1), logits


class Slicing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))

    def forward(self, x, idx):
        h = x[:, 1:-1] * self.w[:, :1]                       # Slice (to a run-time end)
        g = torch.gather(h, 1, idx)                           # GatherElements, repeated indices
        m = torch.maximum(g, self.w[:, 2:4])                  # Max
        c = torch.cat([m, x[:, ::2], self.w[:, -1:]], 1)      # Concat, Slice with step 2
        return (c.repeat(1, 2) * torch.tril(torch.ones(c.size(0), 2 * c.size(1)))).sum(), c


def run_engine(module, args):
    """Export as ORTModule does, build a training engine; return outputs, output gradients and
    (name, parameter, engine gradient) per parameter input."""
    res = export_module(module, args, {}, None)
    # Ranks for the MatMul rule: the exporter leaves some value_info out; onnx shape inference
    # fills it in here (the engine's own shape inference is another stage's work).
    model = onnx.shape_inference.infer_shapes(onnx.load_from_string(res.onnx_bytes))
    named = dict(module.named_parameters(remove_duplicate=False))
    params = [named[n] for n in res.param_names]
    tensors = [*args, *params]
    engine = _C.Engine(model.SerializeToString(), True, [t.is_floating_point() for t in tensors])
    outs, ctx = engine.forward([t.detach() for t in tensors])
    gen = torch.Generator().manual_seed(3)
    gouts = [torch.randn(o.shape, generator=gen) if d else None for o, d in zip(outs, engine.output_differentiable)]
    grads = engine.backward(ctx, gouts)
    return res, engine, outs, gouts, list(zip(res.param_names, params, grads[len(args):]))


@pytest.mark.parametrize("T", [8, 5])
def test_qkv_split_block_matches_eager(T):
    torch.manual_seed(0)
    block = QKVBlock()
    idx, tgt = torch.randint(0, 50, (2, T)), torch.randint(0, 50, (2, T))
    tgt[0, 1] = -1
    res, engine, outs, gouts, grads = run_engine(block, (idx, tgt))
    exported_ops = {n.op_type for n in onnx.load_from_string(res.onnx_bytes).graph.node}
    assert {"SplitToSequence", "SequenceAt", "Trilu", "Range"} <= exported_ops, exported_ops
    engine_ops = {n.op_type for n in onnx.load_from_string(engine.forward_graph_onnx()).graph.node}
    assert "Split" in engine_ops and not engine_ops & {"SplitToSequence", "SequenceAt"}, engine_ops
    loss, logits = block(idx, tgt)
    torch.testing.assert_close(outs[0], loss.detach())
    torch.testing.assert_close(outs[1], logits.detach())
    torch.autograd.backward([loss, logits], [g for g in gouts])
    assert len(grads) == len(list(block.parameters()))  # the tied weight is one input
    for name, p, g in grads:
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("n", [7, 9])
def test_slicing_module_matches_eager(n):
    torch.manual_seed(1)
    mod = Slicing()
    x = torch.randn(4, n)
    idx = torch.tensor([[0, 0], [1, 3], [2, 2], [4, 0]])
    _, _, outs, gouts, grads = run_engine(mod, (x, idx))
    total, c = mod(x, idx)
    torch.testing.assert_close(outs[0], total.detach())
    torch.testing.assert_close(outs[1], c.detach())
    torch.autograd.backward([total, c], gouts)
    [(name, p, g)] = grads
    torch.testing.assert_close(g, mod.w.grad)
