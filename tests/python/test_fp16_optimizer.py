"""FP16_Optimizer around plain torch optimizers: fp16/bf16 models follow the fp32 trajectory,
overflowing steps are skipped without loss, checkpoints resume identically; the fused kernels it
uses; what it does with optimizers it does not know."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

from torch_ort.optim import FP16_Optimizer, FusedAdam, _kernels


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                               torch.nn.GELU(), torch.nn.Linear(64, 4))


def batches(n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 4, generator=gen)
    for _ in range(n):
        x = torch.randn(32, 16, generator=gen)
        yield x, x @ w + 0.1 * torch.randn(32, 4, generator=gen)


def train(model, opt, steps, dtype, wrapped):
    losses = []
    for x, y in batches(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x.to(dtype)).float(), y)
        if wrapped:
            opt.backward(loss)
        else:
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# fp16 keeps ~3 decimal digits, bf16 ~2: the loss trajectories agree to 5e-3 and 2e-2 relative.
@pytest.mark.parametrize("dtype, rel", [(torch.float16, 5e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("inner", [torch.optim.AdamW, FusedAdam])
def test_low_precision_model_follows_the_fp32_trajectory(dtype, rel, inner):
    reference = mlp()
    ref_losses = train(reference, inner(reference.parameters(), lr=3e-3), 60, torch.float32, False)
    model = mlp().to(dtype)
    # A scale low enough that no step overflows: a skipped step would shift the whole trajectory.
    opt = FP16_Optimizer(inner(model.parameters(), lr=3e-3), max_grad_norm=None, initial_scale=256.0)
    losses = train(model, opt, 60, dtype, True)
    assert opt.scaler.skipped_steps == 0
    assert ref_losses[-1] < 0.1 * ref_losses[0]  # it learns, so the comparison means something
    for a, b in zip(losses, ref_losses):
        assert a == pytest.approx(b, rel=rel, abs=rel * ref_losses[-1])
    assert all(p.dtype == dtype for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in opt.master_params)
    for p, m in zip(opt.model_params, opt.master_params):  # the model holds the rounded masters
        assert torch.equal(p.detach(), m.detach().to(dtype))


def test_injected_inf_skips_exactly_that_step_and_loses_nothing():
    model = mlp().to(torch.float16)
    opt = FP16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), initial_scale=1024.0)
    data = list(batches(6))
    for x, y in data[:3]:
        opt.zero_grad()
        opt.backward(F.mse_loss(model(x.half()).float(), y))
        opt.step()
    before = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
    x, y = data[3]
    opt.zero_grad()
    opt.backward(F.mse_loss(model(x.half()).float(), y))
    next(model.parameters()).grad[0, 0] = float("inf")
    opt.step()
    assert opt.overflow and opt.loss_scale == 512.0 and opt.scaler.skipped_steps == 1
    for k, v in before[0].items():
        assert torch.equal(model.state_dict()[k], v), k
    after = opt.state_dict()
    for m, m0 in zip(after["fp32_master_params"], before[1]["fp32_master_params"]):
        assert torch.equal(m, m0)
    for i, s in before[1]["optimizer"]["state"].items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(after["optimizer"]["state"][i][k], s[k])
    # The next clean step goes through at the lowered scale.
    x, y = data[4]
    opt.zero_grad()
    opt.backward(F.mse_loss(model(x.half()).float(), y))
    opt.step()
    assert not opt.overflow
    assert not torch.equal(model.state_dict()["0.weight"], before[0]["0.weight"])


def test_dynamic_scale_grows_after_growth_interval_clean_steps():
    model = mlp().to(torch.bfloat16)
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=1e-3), initial_scale=8.0, growth_interval=3)
    scales = []
    for x, y in batches(7):
        opt.zero_grad()
        opt.backward(F.mse_loss(model(x.bfloat16()).float(), y))
        opt.step()
        scales.append(opt.loss_scale)
    assert scales == [8, 8, 16, 16, 16, 32, 32]
    static = FP16_Optimizer(torch.optim.SGD(mlp().parameters(), lr=1e-3), static_loss_scale=128.0)
    static.scaler.update(overflow=True)
    assert static.loss_scale == 128.0


def test_state_dict_round_trip_resumes_identically():
    def fresh():
        model = mlp().to(torch.bfloat16)
        return model, FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-3), initial_scale=4.0,
                                     growth_interval=2, max_grad_norm=1.0)
    model_a, opt_a = fresh()
    data = list(batches(8))
    train_on = lambda model, opt, part: [  # noqa: E731
        (opt.zero_grad(), opt.backward(F.mse_loss(model(x.bfloat16()).float(), y)), opt.step()) for x, y in part]
    train_on(model_a, opt_a, data[:4])
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "opt": opt_a.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)

    model_b, opt_b = fresh()
    model_b.load_state_dict(saved["model"])
    opt_b.load_state_dict(saved["opt"])
    assert opt_b.loss_scale == opt_a.loss_scale and opt_b.scaler.good_steps == opt_a.scaler.good_steps
    train_on(model_a, opt_a, data[4:])
    train_on(model_b, opt_b, data[4:])
    for (k, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), k
    for a, b in zip(opt_a.master_params, opt_b.master_params):
        assert torch.equal(a, b)


def test_clipping_matches_torch_clip_grad_norm_on_the_unscaled_gradients():
    model = mlp().to(torch.float16)
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.0), initial_scale=256.0)
    x, y = next(batches(1))
    opt.backward(F.mse_loss(model(x.half()).float(), y) * 100)
    expected = [p.grad.float() / 256.0 for p in model.parameters()]
    norm = opt.clip_master_grads(0.5)
    holders = [torch.nn.Parameter(torch.empty_like(e)) for e in expected]
    for h, e in zip(holders, expected):
        h.grad = e
    ref_norm = torch.nn.utils.clip_grad_norm_(holders, 0.5)  # clips `expected` in place
    assert norm == pytest.approx(ref_norm.item(), rel=1e-5) and norm > 0.5
    for m, e in zip(opt.master_params, expected):
        torch.testing.assert_close(m.grad, e, rtol=1e-5, atol=1e-7)


def test_fp32_parameters_are_their_own_masters_and_lr_schedulers_reach_the_inner_groups():
    model = mlp()
    model[0].to(torch.bfloat16)
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    opt = FP16_Optimizer(inner, static_loss_scale=1.0)
    assert len(opt.master_params) == 2 and len(opt.fp32_params) == 4
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()  # no gradients yet: nothing to do, and no error
    sched.step()
    assert inner.param_groups[0]["lr"] == 0.5


def test_unknown_optimizer_objects_come_back_unchanged_with_a_warning():
    class Custom:
        pass
    thing = Custom()
    with pytest.warns(UserWarning, match="returned unchanged"):
        assert FP16_Optimizer(thing) is thing
    opt = FP16_Optimizer(torch.optim.SGD(mlp().parameters(), lr=0.1))
    with pytest.raises(TypeError, match="already wrapped"):
        FP16_Optimizer(opt)


def test_fused_scale_and_norm_kernels_match_torch():
    gen = torch.Generator().manual_seed(0)
    src = [torch.randn(n, generator=gen).to(dt) for n, dt in
           [(40000, torch.float16), (33, torch.bfloat16), (1000, torch.float32)]]
    dst = [torch.empty(t.shape) for t in src]
    assert _kernels.scale(src, dst, 0.25) is False
    for s, d in zip(src, dst):
        assert torch.equal(d, s.float() * 0.25)
    ref = torch.cat([t.double().flatten() for t in src]).norm().item()
    assert _kernels.l2norm(src) == pytest.approx(ref, rel=1e-12)
    for bad in (float("inf"), float("nan")):
        src[0][39999] = bad  # in the SIMD body of a second chunk... and in a tail:
        assert _kernels.scale(src, dst, 1.0) is True and _kernels.has_nonfinite(src)
        src[0][39999] = 0
        src[1][32] = bad
        assert _kernels.scale(src, dst, 1.0) is True and _kernels.has_nonfinite(src)
        src[1][32] = 0
    assert not _kernels.has_nonfinite(src)


def test_deepspeed_zero_1_and_2_patched_train_exactly_as_unpatched():
    """Real DeepSpeed (pinned in requirements) on its CPU accelerator, bf16, one gloo rank: the
    patched overflow checks and gradient norm are the ones DeepSpeed calls, and training is the
    same as unpatched, including the step it skips for nan gradients."""
    import json
    import os
    import sys

    import forkserver
    script = os.path.join(os.path.dirname(__file__), "deepspeed_zero_run.py")
    proc = forkserver.run([sys.executable, script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DS_ACCELERATOR="cpu", MASTER_PORT="29531"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(lines[0][len("RESULTS "):])
    for stage in (1, 2):
        plain, patched = results[f"stage{stage}_plain"], results[f"stage{stage}_patched"]
        assert patched["calls"]["has_overflow_partitioned_grads_serial"] >= 6
        assert patched["calls"]["get_grad_norm_direct"] >= 5
        assert plain["skipped_step_left_params"] and patched["skipped_step_left_params"]
        assert str(patched["losses"]) == str(plain["losses"])  # nan at the skipped step in both
        assert patched["params"] == plain["params"]
        mine, theirs = patched["norm"]
        assert mine == pytest.approx(theirs, rel=1e-6)
        assert (patched["overflow_clean"], patched["overflow_nan"], patched["partitioned_overflow"]) == \
            (False, True, True)


def bf16_linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 4).to(torch.bfloat16)


def one_step(model, opt, x=None):
    x = torch.ones(2, 8, dtype=torch.bfloat16) if x is None else x
    opt.zero_grad()
    opt.backward(model(x).float().sum())
    opt.step()


def test_lr_scheduler_still_drives_the_inner_optimizer_after_load_state_dict():
    model = bf16_linear()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=1.0), static_loss_scale=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s == 0 else 0.0)
    opt.load_state_dict(opt.state_dict())
    sched.step()
    assert opt.param_groups is opt.optimizer.param_groups and opt.state is opt.optimizer.state
    assert opt.optimizer.param_groups[0]["lr"] == 0.0
    before = model.weight.detach().clone()
    one_step(model, opt)
    assert torch.equal(model.weight.detach(), before)  # lr 0: nothing moves


def test_add_param_group_gives_new_low_precision_params_masters_and_unscaling():
    a, b = bf16_linear(0), bf16_linear(1)
    c = torch.nn.Linear(8, 4)
    opt = FP16_Optimizer(torch.optim.SGD(a.parameters(), lr=0.1), initial_scale=1024.0)
    opt.add_param_group({"params": list(b.parameters()) + list(c.parameters())})
    assert len(opt.master_params) == 4 and len(opt.fp32_params) == 2
    ref_b, ref_c = copy.deepcopy(b).float(), copy.deepcopy(c)
    x = torch.ones(2, 8)
    opt.zero_grad()
    opt.backward((a(x.bfloat16()).float().sum() + b(x.bfloat16()).float().sum() + c(x).sum()))
    opt.step()
    sgd = torch.optim.SGD(list(ref_b.parameters()) + list(ref_c.parameters()), lr=0.1)
    (ref_b(x).sum() + ref_c(x).sum()).backward()
    sgd.step()
    torch.testing.assert_close(b.weight.detach().float(), ref_b.weight.detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(c.weight.detach(), ref_c.weight.detach())


def test_channels_last_params_train_and_clip():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    conv_bf16 = torch.nn.Conv2d(3, 4, 3).to(torch.bfloat16).to(memory_format=torch.channels_last)
    for model, dtype in ((conv, torch.float32), (conv_bf16, torch.bfloat16)):
        opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=1.0,
                             max_grad_norm=1.0)
        before = model.weight.detach().clone()
        x = torch.randn(2, 3, 8, 8).to(dtype).to(memory_format=torch.channels_last)
        opt.zero_grad()
        opt.backward(model(x).float().pow(2).sum())
        opt.step()
        assert opt.last_grad_norm > 1.0  # clipped
        moved = (model.weight.detach().float() - before.float()).norm().item()
        assert 0 < moved <= 0.1 * 1.0 + 1e-2  # lr · clipped norm (bf16 rounding aside)
        assert model.weight.is_contiguous(memory_format=torch.channels_last)


def test_a_model_changed_after_wrapping_refreshes_its_masters_with_a_warning():
    model = bf16_linear()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.0), static_loss_scale=1.0)
    model.load_state_dict({k: torch.full_like(v, 7.0) for k, v in model.state_dict().items()})
    with pytest.warns(UserWarning, match="changed outside the optimizer"):
        one_step(model, opt)
    assert torch.all(model.weight.detach() == 7.0)  # lr 0: the loaded weights stay
    # A checkpoint of model and optimizer together (the model holds the masters' rounding) is
    # no change, whichever is loaded first.
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    opt.load_state_dict(saved_opt)
    model.load_state_dict(saved_model)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_step(model, opt)


def test_gradients_not_scaled_by_this_optimizer_are_refused():
    model = bf16_linear()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(2, 8, dtype=torch.bfloat16)).float().sum().backward()  # not opt.backward
    before = model.weight.detach().clone()
    with pytest.raises(RuntimeError, match="did not come through optimizer.backward"):
        opt.step()
    assert torch.equal(model.weight.detach(), before)


def test_unknown_keyword_arguments_and_bad_scale_bounds_raise():
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['clip_grad'\\]"):
        FP16_Optimizer(torch.optim.SGD(bf16_linear().parameters(), lr=0.1), clip_grad=1.0)
    with pytest.raises(ValueError, match="min_scale <= max_scale"):
        FP16_Optimizer(torch.optim.SGD(bf16_linear().parameters(), lr=0.1), min_scale=8.0, max_scale=4.0)


def test_optimizers_survive_deepcopy_and_pickle():
    import pickle
    from torch_ort.optim import AdamWMode, FusedLamb
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    for opt in (FusedAdam([p], set_grad_none=False, adam_w_mode=AdamWMode.ADAMW_TORCH), FusedLamb([p])):
        for twin in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
            twin.param_groups[0]["params"][0].grad = torch.ones(3)
            twin.step()
            twin.zero_grad()
    model = bf16_linear()
    wrapped = FP16_Optimizer(FusedAdam(model.parameters(), lr=0.1), static_loss_scale=1.0)
    twin = copy.deepcopy(wrapped)
    assert twin.optimizer is not wrapped.optimizer and twin.loss_scale == 1.0
    assert twin.param_groups is twin.optimizer.param_groups


def test_per_group_adam_w_mode_loads_with_weights_only():
    from torch_ort.optim import AdamWMode
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    # b's group names a mode other than the default (ADAMW_TORCH), as an enum
    opt = FusedAdam([{"params": [a]}, {"params": [b], "adam_w_mode": AdamWMode.ADAMW_TRANSFORMERS}])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert [g["adam_w_mode"] for g in loaded["param_groups"]] == [2, 1]
