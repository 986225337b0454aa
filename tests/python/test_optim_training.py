"""The two-line promise: `ORTModule(model)` with `FusedAdam` (or FP16_Optimizer for a bf16 model)
trains as eager PyTorch with torch.optim does, step for step."""
import copy
from pathlib import Path

import pytest
import torch

import model_zoo
import torch_ort
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


def readme_two_lines() -> list[str]:
    """The two lines README.md shows (its first Python block): ORTModule, then FusedAdam."""
    block = (Path(__file__).parents[2] / "README.md").read_text().split("```python\n", 1)[1].split("```")[0]
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    ours = [line for line in lines if "ORTModule(" in line or "FusedAdam(" in line]
    assert len(ours) == 2 and "FusedAdam(model.parameters()" in ours[1], block
    return ours


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(12, 32), torch.nn.Linear(32, 5)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


def test_readme_two_lines_train_as_torch_adamw():
    """The README's two lines, exactly as shown, against the same model trained eagerly with
    torch.optim.AdamW called with the same arguments: FusedAdam's defaults are AdamW's (decay
    before the step, eps 1e-8, weight_decay 0.01), so the parameters agree to fp32 rounding."""
    wrap, make_opt = readme_two_lines()
    torch.manual_seed(0)
    eager = MLP()
    ns = {"torch_ort": torch_ort, "model": copy.deepcopy(eager)}
    exec(wrap, ns)
    exec(make_opt, ns)
    ours, opt = ns["model"], ns["optimizer"]
    assert isinstance(ours, ORTModule) and isinstance(opt, FusedAdam)
    ref = {"torch": torch, "model": eager}
    exec(make_opt.replace("torch_ort.optim.FusedAdam(", "torch.optim.AdamW("), ref)
    gen = torch.Generator().manual_seed(1)
    for step in range(12):
        x, y = torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)
        for model, o in ((ours, opt), (eager, ref["optimizer"])):
            o.zero_grad()
            model(x, y).backward()
            o.step()
        for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7,
                                       msg=lambda m: f"step {step}, {name}: {m}")
    assert ours.fallback is None and ours.export_count == 1
