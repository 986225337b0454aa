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
from torch_ort.ortmodule.integrations import hf
from torch_ort.ortmodule.export.exporter import export_module


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


def _lora_llama():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64)
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                            target_modules=["q_proj", "v_proj"]))


def test_peft_lora_trains_whole_called_as_eager(strict):
    """LoRA through peft, called exactly as eager is (no use_cache=False): the PeftModel passes
    its keywords on to the Llama, so the training call runs without the cache the Llama would
    build; losses and the adapters' gradients match eager over AdamW steps, the frozen weights
    get none, and it exports once."""
    eager, wrapped = twin(_lora_llama)
    ours = ORTModule(wrapped)
    trainable = [n for n, p in eager.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in (eager, ours)]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 256, (2, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 9:] = 0
        out_e = eager(input_ids=ids, attention_mask=mask, labels=ids)
        out_o = ours(input_ids=ids, attention_mask=mask, labels=ids)
        assert isinstance(out_e.past_key_values, DynamicCache) and out_o.past_key_values is None
        torch.testing.assert_close(out_o.loss, out_e.loss, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(out_o.logits, out_e.logits, rtol=1e-3, atol=2e-4)
        for out, opt in zip((out_e, out_o), opts):
            opt.zero_grad()
            out.loss.backward()
        for (n, pe), po in zip(eager.named_parameters(), ours.parameters()):
            if pe.requires_grad:
                torch.testing.assert_close(po.grad, pe.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{n}: {m}")
            else:
                assert po.grad is None, n
        for opt in opts:
            opt.step()
    assert ours.export_count == 1


def test_peft_use_cache_true_returns_the_cache(strict):
    eager, wrapped = twin(_lora_llama)
    ours = ORTModule(wrapped)
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    out_o, out_e = ours(input_ids=ids, use_cache=True), eager(input_ids=ids, use_cache=True)
    assert isinstance(out_o.past_key_values, DynamicCache)
    assert len(out_o.past_key_values.layers) == len(out_e.past_key_values.layers) == 2
    for lo, le in zip(out_o.past_key_values.layers, out_e.past_key_values.layers):
        torch.testing.assert_close(lo.keys, le.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lo.values, le.values, rtol=1e-5, atol=1e-6)
