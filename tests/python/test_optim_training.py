"""The two-line promise: `ORTModule(model)` with `FusedAdam` (or FP16_Optimizer for a bf16 model)
trains as eager PyTorch with torch.optim does, step for step."""
import copy

import pytest
import torch

import model_zoo
from torch_ort import ORTModule
from torch_ort.optim import AdamWMode, FP16_Optimizer, FusedAdam


def train(model, opt, steps, wrapped=False, dtype=None):
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        args, kwargs = model_zoo.lm_batch(4, 16, gen)
        opt.zero_grad()
        loss = model_zoo.loss_of(model(*args, **kwargs))
        if wrapped:
            opt.backward(loss)
        else:
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gpt2_with_ortmodule_and_fused_adam_follows_eager_adamw(strict):
    torch.manual_seed(0)
    eager = model_zoo.gpt2()
    eager_fused, ours = copy.deepcopy(eager), ORTModule(copy.deepcopy(eager))
    fused = lambda m: FusedAdam(m.parameters(), lr=1e-3, weight_decay=0.01,  # noqa: E731
                                adam_w_mode=AdamWMode.ADAMW_TORCH)
    ref = train(eager, torch.optim.AdamW(eager.parameters(), lr=1e-3, weight_decay=0.01), 15)
    train(eager_fused, fused(eager_fused), 15)
    got = train(ours, fused(ours), 15)
    assert ref[-1] < ref[0]
    for a, b in zip(got, ref):
        assert a == pytest.approx(b, rel=1e-4)
    # Parameters against eager with the same optimizer: against torch's AdamW, elements whose
    # gradient is ~0 (attention's key bias, unseen tokens) take m/√v from rounding noise and sit
    # up to a few steps (lr) apart — eager with FusedAdam is as far from eager with AdamW there.
    for (name, p), q in zip(ours.named_parameters(), eager_fused.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_bf16_gpt2_with_ortmodule_and_fp16_optimizer_follows_eager(strict):
    torch.manual_seed(0)
    eager = model_zoo.gpt2().to(torch.bfloat16)
    ours = ORTModule(copy.deepcopy(eager))
    make = lambda m: FP16_Optimizer(FusedAdam(m.parameters(), lr=1e-3), static_loss_scale=1.0)  # noqa: E731
    ref = train(eager, make(eager), 15, wrapped=True)
    got = train(ours, make(ours), 15, wrapped=True)
    assert ref[-1] < ref[0]
    for a, b in zip(got, ref):  # bf16 activations: rtol 1e-2
        assert a == pytest.approx(b, rel=1e-2)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
