"""Checkpoints mid-training through ORTModule: model, optimizer (FusedAdam, FusedLamb, under
FP16_Optimizer with its loss scaler) and RNG saved, then a differently initialised process-alike
resumes onto exactly the same losses — dropout masks included."""
import io

import pytest
import torch

import model_zoo
import torch_ort
from torch_ort.optim import FP16_Optimizer, FusedAdam, FusedLamb

STEPS, SAVE_AT = 6, 3


def build(seed, optim, bf16):
    torch.manual_seed(seed)
    model = model_zoo.nanogpt(dropout=0.1)
    if bf16:
        model = model.to(torch.bfloat16)
    model = torch_ort.ORTModule(model)
    make = FusedLamb if optim == "lamb" else FusedAdam
    opt = make(model.parameters(), lr=3e-3, weight_decay=0.01)
    if bf16:
        opt = FP16_Optimizer(opt, initial_scale=2.0 ** 10, growth_interval=2, max_grad_norm=1.0)
    return model, opt


def step(model, opt, gen, bf16):
    (idx, targets), _ = model_zoo.nanogpt_batch(4, 16, gen)
    _, loss = model(idx, targets)
    opt.zero_grad()
    if bf16:
        opt.backward(loss.float())
    else:
        loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize("optim,bf16", [("adam", False), ("lamb", False), ("adam", True), ("lamb", True)])
def test_resume_continues_the_exact_trajectory(strict, optim, bf16):
    model, opt = build(0, optim, bf16)
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(11)  # dropout's stream
    losses = [step(model, opt, gen, bf16) for _ in range(SAVE_AT)]
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": torch.get_rng_state(), "data": gen.get_state()}, buf)
    scale = opt.loss_scale if bf16 else None
    losses += [step(model, opt, gen, bf16) for _ in range(STEPS - SAVE_AT)]

    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    resumed_model, resumed_opt = build(1, optim, bf16)  # other weights until the checkpoint loads
    resumed_model.load_state_dict(saved["model"])
    resumed_opt.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])
    gen = torch.Generator()
    gen.set_state(saved["data"])
    if bf16:
        assert resumed_opt.loss_scale == scale != 2.0 ** 10  # the scaler's state, grown since
    resumed = [step(resumed_model, resumed_opt, gen, bf16) for _ in range(STEPS - SAVE_AT)]
    assert resumed == losses[SAVE_AT:]
    for (name, a), b in zip(model.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), name
