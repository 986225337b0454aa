"""The sync-free optimizer step (optim/_kernels.py): on CUDA, FusedLamb and FP16_Optimizer keep
the global norm, the overflow flag, the loss scale and the step counts on the device, and the
kernels skip or clip by reading them there. Here the CPU takes that path (SYNC_FREE_ON_CPU) and is
compared with its own host path, step by step and bit for bit, and a step is checked to read
nothing back (no .item(), no bool() of a tensor). The CUDA run is in test_optim_cuda.py."""

import pytest
import torch
import torch.nn.functional as F

from torch_ort.optim import FP16_Optimizer, FusedAdam, FusedLamb, _kernels


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(_kernels, "SYNC_FREE_ON_CPU", True)


class NoHostReads:
    """Inside: reading a tensor's value on the host (item, bool, float, int, tolist) raises."""

    NAMES = ("item", "__bool__", "__float__", "__int__", "tolist")

    def __init__(self):
        self.saved = {}

    def __enter__(self):
        def refuse(name):
            def read(*args, **kwargs):
                raise AssertionError(f"Tensor.{name} in a sync-free step")
            return read
        for name in self.NAMES:
            self.saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, refuse(name))
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        return False


def params(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(70, 30), (30,), (0,), (5, 70000 // 5 + 3)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def run_lamb(monkeypatch, sync_free: bool, grads_per_step, **kw):
    monkeypatch.setattr(_kernels, "SYNC_FREE_ON_CPU", sync_free)
    ps = params()
    opt = FusedLamb(ps, lr=1e-2, **kw)
    skipped = []
    for grads in grads_per_step:
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        try:
            opt.step()
            skipped.append(opt.last_step_skipped)
        except FloatingPointError:
            skipped.append("raised")
    return [p.detach().clone() for p in ps], opt, skipped


def lamb_grads(n, scale=1.0, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=gen) * scale for p in params()] for _ in range(n)]


@pytest.mark.parametrize("kw", [dict(), dict(max_grad_norm=0.5), dict(max_grad_norm=None),
                                dict(max_weight_norm=2.0, ratio_min=0.5, ratio_max=3.0, use_nvlamb=True)])
def test_fused_lamb_device_path_is_the_host_path_bit_for_bit(monkeypatch, kw):
    grads = lamb_grads(4, scale=10.0)  # clipped (norm far above max_grad_norm) where it applies
    host, host_opt, _ = run_lamb(monkeypatch, False, grads, **kw)
    dev, dev_opt, skipped = run_lamb(monkeypatch, True, grads, **kw)
    for a, b in zip(host, dev):
        assert torch.equal(a, b)
    assert skipped == [False] * 4
    for g_host, g_dev in zip(host_opt.param_groups, dev_opt.param_groups):
        assert torch.is_tensor(g_dev["step"]) and g_dev["step"].dtype == torch.float64
        assert g_dev["step"].item() == g_host["step"] == 4
    for p_host, p_dev in zip(host_opt.state, dev_opt.state):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(host_opt.state[p_host][key], dev_opt.state[p_dev][key])


def test_fused_lamb_device_path_skips_a_non_finite_norm_where_the_host_raises(monkeypatch):
    grads = lamb_grads(4)
    grads[2][0][3, 4] = float("nan")
    host, host_opt, host_skipped = run_lamb(monkeypatch, False, grads)
    dev, dev_opt, dev_skipped = run_lamb(monkeypatch, True, grads)
    assert host_skipped == [False, False, "raised", False]
    assert dev_skipped == [False, False, True, False]
    for a, b in zip(host, dev):  # the raise and the skip both leave step 3 out entirely
        assert torch.equal(a, b)
    assert dev_opt.param_groups[0]["step"].item() == host_opt.param_groups[0]["step"] == 3


def test_fused_lamb_step_reads_nothing_back(device_path):
    ps = params()
    opt = FusedLamb(ps, lr=1e-2, max_grad_norm=1.0)
    for grads in lamb_grads(3):
        for p, g in zip(ps, grads):
            p.grad = g
        with NoHostReads():
            opt.step()
    assert isinstance(opt.skip_flag, torch.Tensor) and not opt.last_step_skipped


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def fp16_run(monkeypatch, sync_free, inner, steps=8, inf_at=(2, 5), **kw):
    """FP16_Optimizer on an fp16 MLP; gradients of the steps in inf_at get an inf. Returns the
    model's parameters, the optimizer, and per step: loss scale, skipped, norm."""
    monkeypatch.setattr(_kernels, "SYNC_FREE_ON_CPU", sync_free)
    model = mlp().half()
    opt = FP16_Optimizer(inner(model.parameters(), lr=1e-2), initial_scale=2.0 ** 10,
                         growth_interval=2, **kw)
    gen = torch.Generator().manual_seed(1)
    record = []
    for k in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        opt.backward(F.mse_loss(model(x.half()).float(), y))
        if k in inf_at:
            model[0].weight.grad[1, 2] = float("inf")
        opt.step()
        record.append((opt.loss_scale, opt.overflow, opt.last_grad_norm))
    return [p.detach().clone() for p in model.parameters()], opt, record


@pytest.mark.parametrize("inner", [FusedAdam, FusedLamb, torch.optim.AdamW])
@pytest.mark.parametrize("max_grad_norm", [None, 0.05])
def test_fp16_optimizer_device_path_is_the_host_path_bit_for_bit(monkeypatch, inner, max_grad_norm):
    host, host_opt, host_rec = fp16_run(monkeypatch, False, inner, max_grad_norm=max_grad_norm)
    dev, dev_opt, dev_rec = fp16_run(monkeypatch, True, inner, max_grad_norm=max_grad_norm)
    assert [r[:2] for r in dev_rec] == [r[:2] for r in host_rec]
    assert [r[1] for r in host_rec].count(True) == 2  # the injected overflows were skipped
    assert [r[0] for r in host_rec] == [1024, 2048, 1024, 1024, 2048, 1024, 1024, 2048]  # down, up
    if max_grad_norm:
        for (_, over, a), (_, _, b) in zip(host_rec, dev_rec):
            assert over or a == b
    for a, b in zip(host, dev):
        assert torch.equal(a, b)
    assert dev_opt.scaler.state_dict() == host_opt.scaler.state_dict()
    assert dev_opt.scaler.skipped_steps == 2
    if inner is not torch.optim.AdamW:  # the inner's step count leaves the skipped steps out
        assert dev_opt.optimizer.param_groups[0]["step"].item() == host_opt.optimizer.param_groups[0]["step"] == 6


@pytest.mark.parametrize("inner", [FusedAdam, FusedLamb])
def test_fp16_optimizer_step_reads_nothing_back(device_path, inner):
    model = mlp().half()
    opt = FP16_Optimizer(inner(model.parameters(), lr=1e-2), max_grad_norm=1.0, initial_scale=2.0 ** 10)
    gen = torch.Generator().manual_seed(1)
    for k in range(4):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        loss = F.mse_loss(model(x.half()).float(), y)
        if k == 2:  # an overflowing step is skipped without a host read too
            loss = loss * float("inf")
        with NoHostReads():
            opt.zero_grad()
            opt.backward(loss)
            opt.step()
    assert isinstance(opt.found_inf, torch.Tensor)
    assert isinstance(opt.scaler.scale_for(torch.device("cpu")), torch.Tensor)  # the scale lives there
    assert opt.scaler.skipped_steps == 1 and opt.loss_scale == 2.0 ** 9
    assert torch.is_tensor(opt.optimizer.param_groups[0]["step"])
    assert opt.optimizer.param_groups[0]["step"].item() == 3


def test_step_scalars_are_checked_by_name():
    from torch_ort import _C
    p, g = [torch.zeros(3)], [torch.ones(3)]
    m, v = [torch.zeros(3)], [torch.zeros(3)]
    common = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1,
                  bias_correction=True, adam_w_mode=1)
    with pytest.raises(TypeError, match=r"multi_tensor_adam: skip must be one Float element on cpu"):
        _C.multi_tensor_adam(p, g, m, v, **common, skip=torch.zeros(2))
    with pytest.raises(TypeError, match=r"multi_tensor_adam: scale_by must be one Double element"):
        _C.multi_tensor_adam(p, g, m, v, **common, scale_by=torch.ones(()))
    _C.multi_tensor_adam(p, g, m, v, **common, skip=torch.ones(()))  # set: nothing moves
    assert torch.equal(p[0], torch.zeros(3)) and torch.equal(m[0], torch.zeros(3))
    found = torch.zeros(())
    _C.multi_tensor_scale_flag([torch.tensor([1.0, float("inf")])], [torch.empty(2)], 1.0, found=found)
    assert found.item() == 1.0
