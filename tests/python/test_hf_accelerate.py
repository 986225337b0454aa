"""accelerate around an ORTModule-wrapped Hugging Face model, with nothing patched: Accelerator.prepare
trains it as it trains the eager model; unwrap_model, get_state_dict, save_model and
save_state/load_state save and load through the wrapped model's keys (and the unwrapped model's
save_pretrained writes a from_pretrained checkpoint); torch_ort leaves accelerate's and
transformers' functions as they were."""
import accelerate
import accelerate.accelerator
import accelerate.utils.other
import pytest
import safetensors.torch
import torch
import transformers
import transformers.modeling_utils

import model_zoo
import torch_ort
from torch_ort.utils import hf

STEPS, SAVED_AT = 4, 2  # save_state after step SAVED_AT of the ORTModule run


def batches():
    gen = torch.Generator().manual_seed(0)
    return [model_zoo.lm_batch(4, 16, gen)[1] for _ in range(STEPS)]


def prepare(ort: bool, seed: int = 0):
    torch.manual_seed(seed)
    model = model_zoo.gpt2()
    if ort:
        model = torch_ort.ORTModule(model)
    accelerator = accelerate.Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def train(accelerator, model, optimizer, data, save_to=None):
    losses = []
    for step, kw in enumerate(data, 1):
        loss = model(**kw).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if save_to is not None and step == SAVED_AT:
            accelerator.save_state(str(save_to))
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out, data = {}, batches()
    for name in ("eager", "ort"):
        accelerator, model, optimizer = prepare(name == "ort")
        state = tmp_path_factory.mktemp("state") if name == "ort" else None
        out[name] = accelerator, model, train(accelerator, model, optimizer, data, state), state
    return out


def test_prepare_trains_an_ortmodule_as_eager(runs):
    _, model, ours, _ = runs["ort"]
    _, eager_model, eager, _ = runs["eager"]
    assert isinstance(model, torch_ort.ORTModule)  # one CPU process: prepare wraps nothing
    assert model.export_count == 1 and model.fallback is None
    assert len(ours) == STEPS and ours[-1] < ours[0]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=1e-5, atol=0)
    # atol 1e-5: the attention key biases get (mathematically zero) rounding-noise gradients, and
    # AdamW's normalised step turns noise into lr-sized moves; they differ by ~3e-6 after 4 steps
    for (name, a), b in zip(model.state_dict().items(), eager_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_unwrap_model_and_get_state_dict_are_the_wrapped_models(runs):
    accelerator, model, _, _ = runs["ort"]
    assert accelerator.unwrap_model(model) is model  # accelerate unwraps its own wrappers only
    state, inner = accelerator.get_state_dict(model), model.module.state_dict()
    assert list(state) == list(inner)  # the transformers model's keys, no ORTModule prefix
    assert all(state[k] is inner[k] or torch.equal(state[k], inner[k]) for k in inner)


def test_save_model_loads_into_the_plain_model(runs, tmp_path):
    accelerator, model, _, _ = runs["ort"]
    accelerator.save_model(model, str(tmp_path))
    plain = model_zoo.gpt2()
    safetensors.torch.load_model(plain, str(tmp_path / "model.safetensors"))
    assert plain.lm_head.weight is plain.transformer.wte.weight
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_unwrapped_save_pretrained_loads_with_from_pretrained(runs, tmp_path):
    accelerator, model, _, _ = runs["ort"]
    accelerator.unwrap_model(model).save_pretrained(str(tmp_path), save_function=accelerator.save)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path))
    assert loaded.config.architectures == ["GPT2LMHeadModel"]
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # the tie survives
    state = model.state_dict()
    assert list(state) == list(loaded.state_dict())
    for (name, a), b in zip(state.items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_load_state_continues_the_trajectory(runs):
    _, _, losses, state = runs["ort"]
    accelerator, model, optimizer = prepare(True, seed=123)  # only the saved state can make it match
    accelerator.load_state(str(state))
    assert train(accelerator, model, optimizer, batches()[SAVED_AT:]) == losses[SAVED_AT:]


def test_wrapping_a_transformers_model_patches_nothing(tmp_path):
    holders = (accelerate.utils.other, accelerate.utils, accelerate.accelerator, transformers.modeling_utils)
    before = [h.extract_model_from_parallel for h in holders]
    save_model = transformers.Trainer.save_model
    model = torch_ort.ORTModule(model_zoo.gpt2())
    hf.Trainer(model=model, args=transformers.TrainingArguments(str(tmp_path), use_cpu=True, report_to=[]))
    assert [h.extract_model_from_parallel for h in holders] == before
    # whatever ran before this test: every name is the one function accelerate's own file defines
    assert all(f is before[0] for f in before) and not hasattr(before[0], "__wrapped__")
    assert before[0].__code__.co_filename == accelerate.utils.other.__file__
    assert transformers.Trainer.save_model is save_model
