"""Real models train through ORTModule with eager parity and nothing falling back to eager:
Hugging Face GPT-2, BERT (masked LM, sequence classification) and T5 (encoder-decoder), a
hand-written nanoGPT and a classifier taking its batch as one nested dict.

Tolerances (fp32): per-step losses rtol 1e-4; gradients rtol 1e-3 / atol 1e-5. When a test fails
for a missing op, `scripts/model_ops.py NAME` lists what the engine still lacks for that model."""
import copy
import math

import pytest
import torch

import model_zoo
from torch_ort import ORTModule

STEPS = 20
LOSS_RTOL = 1e-4
GRAD_TOL = dict(rtol=1e-3, atol=1e-5)
MODELS = sorted(model_zoo.ZOO)


def make_twins(name, dropout=0.0):
    factory, make_batch = model_zoo.ZOO[name]
    torch.manual_seed(0)
    eager = factory(dropout=dropout)
    return eager, ORTModule(copy.deepcopy(eager)), make_batch


def train_step(model, opt, args, kwargs, seed=None):
    """One AdamW step; returns the output, the loss and the gradients (before the update)."""
    if seed is not None:
        torch.manual_seed(seed)  # the same dropout masks for both runs
    opt.zero_grad(set_to_none=True)
    out = model(*args, **kwargs)
    loss = model_zoo.loss_of(out)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    return out, loss.item(), grads


def assert_grads_close(ours, eager, where):
    assert ours.keys() == eager.keys(), f"{where}: gradients for different parameters"
    for name, g in eager.items():
        torch.testing.assert_close(ours[name], g, **GRAD_TOL, msg=lambda m: f"{where}, {name}: {m}")


def assert_same_output_structure(out_o, out_e):
    assert type(out_o) is type(out_e)
    if isinstance(out_e, tuple):
        assert len(out_o) == len(out_e)
        return
    # use_cache is turned off while gradients flow (torch_ort/ortmodule/integrations/hf.py): no past_key_values.
    assert list(out_o.keys()) == [k for k in out_e.keys() if k != "past_key_values"]


def counts(ours):
    return ours.export_count, ours.engine_build_count


def run_parity(name, dropout=0.0, steps=STEPS, shapes=((4, 16),)):
    """Trains eager and ORTModule side by side. ours.first_counts: (exports, engines) after the
    first step, which may take more than one export (ATen-fallback rounds); later steps add none."""
    eager, ours, make_batch = make_twins(name, dropout)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3, weight_decay=0.01)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    losses_e, losses_o = [], []
    for step in range(steps):
        b, t = shapes[step % len(shapes)]
        args, kwargs = make_batch(b, t, gen)
        seed = 1000 + step if dropout else None
        out_e, loss_e, grads_e = train_step(eager, opt_e, args, kwargs, seed)
        out_o, loss_o, grads_o = train_step(ours, opt_o, args, kwargs, seed)
        losses_e.append(loss_e)
        losses_o.append(loss_o)
        if step == 0:
            assert_same_output_structure(out_o, out_e)
            ours.first_counts = counts(ours)
        assert math.isfinite(loss_o), f"step {step}: loss {loss_o}"
        assert loss_o == pytest.approx(loss_e, rel=LOSS_RTOL), f"step {step}: {losses_o} vs {losses_e}"
        if step in (0, steps - 1):
            assert_grads_close(grads_o, grads_e, f"step {step}")
    return eager, ours, losses_e, losses_o


@pytest.mark.parametrize("name", MODELS)
def test_trains_20_steps_like_eager(strict, name):
    eager, ours, losses_e, losses_o = run_parity(name)
    assert sum(losses_o[-5:]) < sum(losses_o[:5])  # it learns
    assert counts(ours) == ours.first_counts  # nothing re-exported or rebuilt after the first step
    # Parameters are not compared after 20 steps: some gradients are zero up to rounding (an
    # attention key bias shifts all scores of a query equally, so softmax ignores it), and AdamW
    # turns rounding-sized gradients into full lr-sized steps of either sign.


@pytest.mark.parametrize("name", MODELS)
def test_batch_and_sequence_change_without_reexport(strict, name):
    _, ours, _, _ = run_parity(name, steps=5, shapes=((4, 16), (2, 9), (3, 31), (1, 5), (6, 12)))
    assert counts(ours) == ours.first_counts and ours.engine_build_count == 1


def test_gpt2_first_call_exports_once(strict):
    """Hugging Face GPT-2 called without an attention mask (input_ids and labels, as
    examples/huggingface_gpt2.py calls it) computes its positions with cumsum: ONNX CumSum, which
    runs on our kernel. One export on the first call (it used to take a second to route cumsum
    through the ATen fallback), none after, nothing routed, at eager parity."""
    eager, ours, _ = make_twins("gpt2")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3, weight_decay=0.01)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(3)
    for step, (b, t) in enumerate(((4, 16), (2, 9), (3, 31))):
        ids = torch.randint(1, model_zoo.VOCAB, (b, t), generator=gen)
        _, loss_e, grads_e = train_step(eager, opt_e, (), {"input_ids": ids, "labels": ids})
        _, loss_o, grads_o = train_step(ours, opt_o, (), {"input_ids": ids, "labels": ids})
        assert ours.export_count == 1 and ours.engine_build_count == 1, f"after step {step}"
        assert loss_o == pytest.approx(loss_e, rel=LOSS_RTOL), f"step {step}"
        assert_grads_close(grads_o, grads_e, f"step {step}")
    routed = {str(op): why for op, why in ours._aten_fallback.reasons.items()}
    assert routed == {}


# torch 2.11's exporter fails on a model that returns a transformers cache (DynamicCache,
# EncoderDecoderCache) from a call under no_grad; later torch exports it (scripts/check_torch.sh).
CACHE_UNDER_NO_GRAD_FAILS = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 12)


@pytest.mark.parametrize("name", MODELS)
def test_dropout_same_seed_same_masks(strict, name, request):
    """Our Dropout kernel draws its mask from the torch generator exactly as eager does, in the same
    order, so with the same seed the two runs see the same masks and must agree to the same
    tolerances; a different seed must change the loss (dropout really is on)."""
    if name in ("gpt2", "t5") and CACHE_UNDER_NO_GRAD_FAILS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            f"torch {torch.__version__}'s exporter fails on a cache returned under no_grad")))
    _, ours, losses_e, losses_o = run_parity(name, dropout=0.1, steps=5)
    args, kwargs = model_zoo.ZOO[name][1](4, 16, torch.Generator().manual_seed(7))
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            draws.append(model_zoo.loss_of(ours(*args, **kwargs)).item())
    assert all(math.isfinite(v) for v in draws) and draws[0] != draws[1]


@pytest.mark.parametrize("name, tied", [("gpt2", ("transformer.wte.weight", "lm_head.weight")),
                                        ("nanogpt", ("wte.weight", "lm_head.weight"))], ids=["gpt2", "nanogpt"])
def test_tied_embedding_and_lm_head_stay_one_parameter(strict, name, tied):
    _, ours, _, _ = run_parity(name, steps=3)  # gradients of the tied weight match eager's sum
    params = dict(ours.named_parameters(remove_duplicate=False))
    assert params[tied[0]] is params[tied[1]]
    runner = next(iter(ours._plan_cache.runners()))
    assert sum(p is params[tied[0]] for p in runner.params) == 1  # one graph input, one gradient


def test_freezing_embeddings_rebuilds_only_the_gradient_graph(strict):
    eager, ours, make_batch = make_twins("bert_cls")
    gen = torch.Generator().manual_seed(3)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    for step in range(4):
        if step == 1:
            before = counts(ours)
        if step == 2:
            for m in (eager, ours):
                m.bert.embeddings.requires_grad_(False)
        args, kwargs = make_batch(4, 12, gen)
        _, loss_e, grads_e = train_step(eager, opt_e, args, kwargs)
        _, loss_o, grads_o = train_step(ours, opt_o, args, kwargs)
        assert loss_o == pytest.approx(loss_e, rel=LOSS_RTOL)
        assert_grads_close(grads_o, grads_e, f"step {step}")
    assert not any("embeddings" in n for n in grads_o)
    assert counts(ours) == (before[0], before[1] + 1)  # one more engine, no new export
