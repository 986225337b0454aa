"""transformers' KV cache under ORTModule: use_cache is off where gradients flow unless asked for;
an explicit use_cache=True, or a no_grad call, returns a DynamicCache rebuilt from graph outputs."""
import types

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast, CausalLMOutputWithCrossAttentions

import model_zoo
from conftest import twin
from torch_ort import DebugOptions, LogLevel, ORTModule
from torch_ort.ortmodule import hf
from torch_ort.ortmodule.exporter import export_module


class TinyDecoder(torch.nn.Module):
    """Behaves like a transformers decoder: config.use_cache defaults to True and the output
    carries a DynamicCache of keys and values."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(use_cache=True)
        self.k = torch.nn.Linear(4, 4)
        self.v = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x, labels=None, use_cache=None):
        use_cache = self.config.use_cache if use_cache is None else use_cache
        k, v = self.k(x), self.v(x)
        cache = None
        if use_cache:
            cache = DynamicCache()
            cache.update(k.unsqueeze(1).unsqueeze(1), v.unsqueeze(1).unsqueeze(1), 0)  # (B, 1, 1, D)
        logits = self.head(torch.tanh(k * v))
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)


def test_training_call_runs_without_cache(strict, caplog):
    eager, wrapped = twin(TinyDecoder)
    ours = ORTModule(wrapped, DebugOptions(log_level=LogLevel.INFO))  # records reach caplog: they propagate
    for seed in range(2):
        x, y = data(seed)
        out_o, out_e = ours(x, labels=y), eager(x, labels=y)
        assert isinstance(out_e.past_key_values, DynamicCache)  # eager builds one, unused
        assert type(out_o) is CausalLMOutputWithPast and list(out_o.keys()) == ["loss", "logits"]
        torch.testing.assert_close(out_o.loss, out_e.loss)
        out_o.loss.backward()
        out_e.loss.backward()
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    said = [r.getMessage() for r in caplog.records if "use_cache=False" in r.getMessage()]
    assert len(said) == 1 and "TinyDecoder" in said[0], said  # logged once, naming the model
    assert ours.export_count == 1


def test_explicit_use_cache_returns_the_cache(strict):
    eager, wrapped = twin(TinyDecoder)
    ours = ORTModule(wrapped)
    x, y = data()
    out_o, out_e = ours(x, labels=y, use_cache=True), eager(x, labels=y, use_cache=True)
    assert list(out_o.keys()) == list(out_e.keys()) == ["loss", "logits", "past_key_values"]
    cache = out_o.past_key_values
    assert type(cache) is DynamicCache and cache.get_seq_length() == 1
    torch.testing.assert_close(cache.layers[0].keys, out_e.past_key_values.layers[0].keys)
    torch.testing.assert_close(cache.layers[0].values, out_e.past_key_values.layers[0].values)
    out_o.loss.backward()  # the cache's tensors get no gradient: treated as zeros
    out_e.loss.backward()
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)


def test_no_grad_call_keeps_the_models_default(strict):
    eager, wrapped = twin(TinyDecoder)
    ours = ORTModule(wrapped)
    x, _ = data()
    with torch.no_grad():
        out_o, out_e = ours(x), eager(x)
    assert list(out_o.keys()) == list(out_e.keys()) == ["logits", "past_key_values"]
    torch.testing.assert_close(out_o.past_key_values.layers[0].keys, out_e.past_key_values.layers[0].keys)


def test_adapt_call_rules_on_gpt2():
    model = model_zoo.gpt2()
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert hf.adapt_call(model, (), {"input_ids": ids}, True)["use_cache"] is False
    assert hf.adapt_call(model, (ids,), {}, True) == {"use_cache": False}  # positional input_ids
    for kwargs in ({"input_ids": ids, "use_cache": True}, {"input_ids": ids, "use_cache": False}):
        assert hf.adapt_call(model, (), kwargs, True) is kwargs  # the caller decided
    assert "use_cache" not in hf.adapt_call(model, (), {"input_ids": ids}, False)  # no_grad
    model.config.use_cache = False
    assert "use_cache" not in hf.adapt_call(model, (), {"input_ids": ids}, True)  # nothing to turn off
    bert = model_zoo.bert_mlm()  # an encoder: no cache, nothing changes
    assert "use_cache" not in hf.adapt_call(bert, (), {"input_ids": ids}, True)


def test_gpt2_exports_as_the_call_decides():
    model = model_zoo.gpt2()
    ids = torch.randint(1, model_zoo.VOCAB, (2, 8))
    train = export_module(model, (), hf.adapt_call(model, (), {"input_ids": ids, "labels": ids}, True), None)
    assert train.out_spec.type is CausalLMOutputWithCrossAttentions
    assert train.out_spec.context == ["loss", "logits"]
    with torch.no_grad():
        infer = export_module(model.eval(), (), hf.adapt_call(model, (), {"input_ids": ids}, False), None)
    assert infer.out_spec.context == ["logits", "past_key_values"]
    assert infer.out_spec.child(1).type is DynamicCache
    assert infer.out_spec.num_leaves == 1 + 2 * model.config.n_layer  # logits, then K and V per layer
