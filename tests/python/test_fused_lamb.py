"""FusedLamb against a plain per-parameter reference (optim_reference.lamb_step), step by step,
on both CPU kernel paths, for each option; bad input."""
import math

import pytest
import torch

from torch_ort.optim import FusedLamb

from optim_reference import global_norm, lamb_step
from test_fused_adam import make_params, random_grads


OPTIONS = {
    "defaults": dict(),
    "l2-no-averaging": dict(adam_w_mode=False, grad_averaging=False),
    "no-decay": dict(weight_decay=0.0),                       # ratio 1: plain Adam direction
    "nvlamb-no-decay": dict(weight_decay=0.0, use_nvlamb=True),
    "ratio-clipped": dict(ratio_min=0.5, ratio_max=2.0),
    "weight-norm-clamped": dict(max_weight_norm=3.0),
    "no-bias-correction-no-clip": dict(bias_correction=False, max_grad_norm=None),
    "tight-clip": dict(max_grad_norm=0.1),                    # clipping active every step
}


def reference_hyper(opt, group):
    return dict(lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1], eps=group["eps"],
                weight_decay=group["weight_decay"], bias_correction=group["bias_correction"],
                adam_w_mode=group["adam_w_mode"], grad_averaging=group["grad_averaging"],
                use_nvlamb=group["use_nvlamb"], ratio_min=group["ratio_min"],
                ratio_max=group["ratio_max"], max_weight_norm=group["max_weight_norm"])


def run(options, dtypes=(torch.float32,), steps=100):
    params = make_params(dtypes)
    ref = [p.detach().clone() for p in params]
    opt = FusedLamb([{"params": params[:2]}, {"params": params[2:], "lr": 5e-3}], lr=1e-2, **options)
    ms = [torch.zeros(p.shape) for p in ref]
    vs = [torch.zeros(p.shape) for p in ref]
    gen = torch.Generator().manual_seed(4)
    for step in range(1, steps + 1):
        random_grads(params, gen)
        grads = [p.grad for p in params]
        opt.step()
        scale = 1.0
        if opt.max_grad_norm:
            scale = 1.0 / max(1.0, global_norm(grads) / opt.max_grad_norm)
        for group, idx in zip(opt.param_groups, ([0, 1], [2, 3])):
            lamb_step([ref[i] for i in idx], [grads[i] for i in idx], [ms[i] for i in idx],
                      [vs[i] for i in idx], step=step, grad_scale=scale, **reference_hyper(opt, group))
    return params, ref, opt, ms


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_matches_reference_over_100_steps(cpu_path, options):
    params, ref, opt, ms = run(options)
    for p, r, m in zip(params, ref, ms):
        # The trust ratio divides two norms summed in different orders: rtol 1e-5.
        torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_match_fp32_math_reference(cpu_path, dtype):
    params, ref, _, _ = run({}, dtypes=(dtype, torch.float32), steps=20)
    for p, r in zip(params, ref):
        assert p.dtype == r.dtype
        # A ratio that differs in its last bits can flip a rounding to the low-precision grid.
        tol = dict(rtol=1e-2, atol=1e-2) if p.dtype != torch.float32 else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.detach().float(), r.float(), **tol)


def test_trust_ratio_moves_each_tensor_by_lr_times_its_norm():
    # One step from m = v = 0 without decay clipping: u = g/(|g| + eps) elementwise, and the
    # ratio makes ‖Δp‖ = lr·‖p‖ for every tensor whatever its gradient's scale.
    big = torch.nn.Parameter(torch.full((100,), 2.0))
    small = torch.nn.Parameter(torch.full((10,), 0.5))
    before = [big.detach().clone(), small.detach().clone()]
    opt = FusedLamb([big, small], lr=0.1, weight_decay=1e-9, max_grad_norm=None, eps=0.0)
    big.grad, small.grad = torch.full((100,), 1e3), torch.full((10,), 1e-3)
    opt.step()
    for p, b in zip((big, small), before):
        assert (p.detach() - b).norm().item() == pytest.approx(0.1 * b.norm().item(), rel=1e-4)


def test_nonfinite_gradient_norm_raises_before_touching_anything():
    params = make_params()
    opt = FusedLamb(params)
    random_grads(params, torch.Generator().manual_seed(0))
    opt.step()
    snapshot = [p.detach().clone() for p in params], [opt.state[p]["exp_avg"].clone() for p in params]
    random_grads(params, torch.Generator().manual_seed(1))
    params[1].grad[3] = math.nan
    with pytest.raises(FloatingPointError, match="global gradient norm is nan; no parameter was updated"):
        opt.step()
    for p, before, m in zip(params, *snapshot):
        assert torch.equal(p.detach(), before) and torch.equal(opt.state[p]["exp_avg"], m)
    assert opt.param_groups[0]["step"] == 1


def test_state_dict_round_trip_resumes_identically():
    a = make_params((torch.float32, torch.bfloat16))
    opt_a = FusedLamb(a, lr=1e-2)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        random_grads(a, gen)
        opt_a.step()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = FusedLamb(b, lr=1e-2)
    opt_b.load_state_dict(opt_a.state_dict())
    for _ in range(3):
        random_grads(a, gen)
        for pa, pb in zip(a, b):
            pb.grad = pa.grad.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("kwargs, match", [
    (dict(ratio_min=2.0, ratio_max=1.0), "trust-ratio bounds"),
    (dict(max_weight_norm=0.0), "max_weight_norm"),
    (dict(betas=(0.9, 1.5)), "betas"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusedLamb([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_sparse_gradient_raises():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="FusedLamb does not support sparse gradients"):
        FusedLamb(emb.parameters()).step()
