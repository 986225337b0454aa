"""When ORTModule re-exports and when it only rebuilds: batch size and sequence length change
without re-export; a new input schema (optional input present or absent, a flag flipped, a dtype
changed) re-exports; freezing layers builds a new gradient graph from the same export."""
import pytest
import torch
import torch.nn.functional as F

import model_zoo
from conftest import MLPClassifier, classifier_batch, twin
from torch_ort import ORTModule
from torch_ort.ortmodule.integrations import hf
from torch_ort.ortmodule.export.exporter import export_module


class TinyAttention(torch.nn.Module):
    """One masked self-attention layer over (B, T, C) with a per-token loss: the sequence dim
    flows through matmuls, softmax, masking and the loss."""

    def __init__(self, width=8, classes=5):
        super().__init__()
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.v = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x, labels, attention_mask=None, causal=False, scale=None):
        q, k, v = self.q(x), self.k(x), self.v(x)                                # (B, T, C) each
        scores = q @ k.transpose(1, 2) * (scale or q.shape[-1] ** -0.5)          # (B, T, T)
        if attention_mask is not None:
            keep = attention_mask.unsqueeze(1).to(scores.dtype)                  # (B, 1, T)
            scores = scores + (1.0 - keep) * -1e4
        if causal:
            t = x.shape[1]
            scores = scores + torch.ones(t, t).triu(1) * -1e4
        logits = self.head(scores.softmax(-1) @ v)                               # (B, T, classes)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten()), logits


def seq_batch(b, t, gen, width=8, mask_dtype=torch.long):
    x = torch.randn(b, t, width, generator=gen)
    labels = torch.randint(0, 5, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=mask_dtype)
    mask[0, t - 1:] = 0
    return x, labels, mask


def test_batch_and_sequence_change_without_reexport(strict):
    eager, wrapped = twin(TinyAttention)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(0)
    for b, t in [(2, 5), (3, 9), (1, 4), (4, 4), (2, 16)]:
        x, labels, mask = seq_batch(b, t, gen)
        loss_o, logits_o = ours(x, labels, attention_mask=mask)
        loss_e, logits_e = eager(x, labels, attention_mask=mask)
        assert logits_o.shape == (b, t, 5)
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6)
        loss_o.backward()
        loss_e.backward()
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    assert (ours.export_count, ours.engine_build_count) == (1, 1)


@pytest.mark.parametrize("name", sorted(model_zoo.ZOO))
def test_models_export_batch_and_sequence_as_symbols(name):
    """torch.export with Dim.AUTO must not pin the sequence length of these models (positional
    embeddings, masks and reshapes all see it) nor the batch size: the first two dims of every
    input (a feature dim a Linear reads, as dict_batch's, is fixed by the model)."""
    factory, make_batch = model_zoo.ZOO[name]
    model = factory()
    args, kwargs = make_batch(3, 7, torch.Generator().manual_seed(0))
    kwargs = hf.adapt_call(model, args, kwargs, True)
    result = export_module(model, args, kwargs, None)
    assert result.static_dims and all(d is None for dims in result.static_dims for d in dims[:2]), \
        (name, result.input_names, result.static_dims)


def test_schema_changes_reexport_sizes_do_not(strict):
    ours = ORTModule(TinyAttention())
    gen = torch.Generator().manual_seed(1)
    x, labels, mask = seq_batch(2, 6, gen)
    calls = [
        (dict(attention_mask=mask), 1),
        (dict(attention_mask=seq_batch(3, 8, gen)[2]), 1),          # new sizes: same graph
        (dict(), 2),                                                # optional input absent
        (dict(attention_mask=mask, causal=True), 3),                # a bool flag flipped
        (dict(attention_mask=mask.to(torch.float32)), 4),           # the mask's dtype changed
        (dict(attention_mask=mask, scale=0.5), 5),                  # a float argument given
        (dict(attention_mask=mask, scale=0.5), 5),                  # ... the same value again
        (dict(attention_mask=mask), 5),                             # back to the first schema
    ]
    for i, (kw, exports) in enumerate(calls):
        b, t = kw["attention_mask"].shape if "attention_mask" in kw else (2, 6)
        xb, lb, _ = seq_batch(b, t, gen)
        ours(xb, lb, **kw)[0].backward()
        assert ours.export_count == exports, (i, kw.keys())


def test_freezing_layers_rebuilds_only_the_gradient_graph(strict):
    eager, wrapped = twin(MLPClassifier)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(2)

    def step():
        x, y = classifier_batch(6, gen=gen)
        for m in (eager, ours):
            m.zero_grad(set_to_none=True)
            m(x, y)[0].backward()
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            assert (q.grad is None) == (p.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)

    step()
    assert (ours.export_count, ours.engine_build_count) == (1, 1)
    for m in (eager, ours):
        m.fc1.requires_grad_(False)  # freeze the first layer
    step()
    assert ours.fc1.weight.grad is None and ours.fc2.weight.grad is not None
    assert (ours.export_count, ours.engine_build_count) == (1, 2)
    for m in (eager, ours):
        m.fc1.requires_grad_(True)  # unfreeze: the first engine is reused
    step()
    assert (ours.export_count, ours.engine_build_count) == (1, 2)
    with torch.no_grad():  # forward-only: a third engine, still the same export
        ours(*classifier_batch(3, gen=gen))
    assert (ours.export_count, ours.engine_build_count) == (1, 3)
