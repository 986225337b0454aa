"""FP16_Optimizer's in-place patches of Megatron-LM, Apex AMP and accelerate optimizers (the
DeepSpeed one is tested against real DeepSpeed in test_fp16_optimizer.py). Megatron-LM and Apex
need CUDA to install, so these run against stand-ins that carry the attributes the patches read
and the original methods' behaviour; they test our side, not compatibility with those libraries."""
import sys
import types

import pytest
import torch

from torch_ort.optim import FP16_Optimizer
from torch_ort.optim.modifiers import PATCHED


def params_with_grads(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype)) for n in (300, 7)]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=gen).to(dtype) * 10
    return ps


class MegatronStandIn:
    """The attributes of megatron.fp16.fp16.FP16_Optimizer the patch uses, with its original
    (per-tensor) methods."""
    def __init__(self):
        self.fp16_groups = [params_with_grads(torch.float16)]
        self.fp32_from_fp32_groups = [params_with_grads(torch.float32, seed=1)]
        self.optimizer = torch.optim.SGD(params_with_grads(torch.float32, seed=2), lr=0.1)
        self.overflow = False

    def _check_overflow(self):
        ps = [p for g in self.fp16_groups + self.fp32_from_fp32_groups for p in g]
        self.overflow = any(not torch.isfinite(p.grad).all() for p in ps)
        return self.overflow

    def clip_master_grads(self, max_norm, norm_type=2):
        if self.overflow:
            return -1
        ps = [p for g in self.optimizer.param_groups for p in g["params"]]
        return torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type).item()


MegatronStandIn.__module__, MegatronStandIn.__qualname__ = "megatron.fp16.fp16", "FP16_Optimizer"


def test_megatron_patch_matches_the_original_methods():
    original, patched = MegatronStandIn(), MegatronStandIn()
    assert FP16_Optimizer(patched) is patched and getattr(patched, PATCHED) == "megatron_fp16"
    assert patched._check_overflow() is False and original._check_overflow() is False
    assert patched.clip_master_grads(1.0) == pytest.approx(original.clip_master_grads(1.0), rel=1e-6)
    for a, b in zip(original.optimizer.param_groups[0]["params"], patched.optimizer.param_groups[0]["params"]):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    patched.fp16_groups[0][1].grad[3] = float("inf")
    assert patched._check_overflow() is True and patched.overflow
    assert patched.clip_master_grads(1.0) == -1
    assert FP16_Optimizer(patched) is patched  # patching twice is a no-op


def test_accelerate_wrapper_is_patched_through_to_the_optimizer_inside():
    class Wrapper:
        def __init__(self, optimizer):
            self.optimizer = optimizer
    Wrapper.__module__, Wrapper.__qualname__ = "accelerate.utils.deepspeed", "DeepSpeedOptimizerWrapper"
    inner = MegatronStandIn()
    wrapper = Wrapper(inner)
    assert FP16_Optimizer(wrapper) is wrapper and getattr(inner, PATCHED) == "megatron_fp16"


def test_a_known_class_missing_a_method_is_left_alone_with_a_warning():
    class Changed:
        pass
    Changed.__module__, Changed.__qualname__ = "megatron.fp16.fp16", "FP16_Optimizer"
    opt = Changed()
    with pytest.warns(UserWarning, match="has no _check_overflow, clip_master_grads"):
        assert FP16_Optimizer(opt) is opt
    assert not hasattr(opt, PATCHED)


def test_apex_amp_unscale_is_fused(monkeypatch):
    calls = []
    process = types.ModuleType("apex.amp._process_optimizer")
    process.post_backward_models_are_masters = lambda scaler, params, stash: calls.append(len(params))
    amp = types.ModuleType("apex.amp")
    amp._process_optimizer = process
    apex = types.ModuleType("apex")
    apex.amp = amp
    monkeypatch.setitem(sys.modules, "apex", apex)
    monkeypatch.setitem(sys.modules, "apex.amp", amp)
    monkeypatch.setitem(sys.modules, "apex.amp._process_optimizer", process)

    fp16 = params_with_grads(torch.float16)
    stash = types.SimpleNamespace(
        all_fp16_params=fp16,
        all_fp32_from_fp16_params=[torch.nn.Parameter(p.detach().float()) for p in fp16],
        all_fp32_from_fp32_params=[], all_fp32_from_fp32_grad_stash=[])
    opt = torch.optim.SGD(stash.all_fp32_from_fp16_params, lr=0.1)
    opt._amp_stash = stash
    opt._amp_lazy_init = lambda: None
    opt._post_amp_backward = lambda scaler: pytest.fail("Apex's own path ran")
    scaler = types.SimpleNamespace(loss_scale=lambda: 8.0, _has_overflow=False, _overflow_buf=torch.zeros(1))
    assert FP16_Optimizer(opt) is opt and getattr(opt, PATCHED) == "apex_amp"

    opt._post_amp_backward(scaler)
    for p16, p32 in zip(fp16, stash.all_fp32_from_fp16_params):
        assert torch.equal(p32.grad, p16.grad.float() / 8.0)
    assert not scaler._has_overflow and calls == [0]
    for p32 in stash.all_fp32_from_fp16_params:
        p32.grad = None
    fp16[0].grad[5] = float("nan")
    opt._post_amp_backward(scaler)
    assert scaler._has_overflow and scaler._overflow_buf.item() == 1


def test_apex_own_fused_optimizers_are_left_alone(monkeypatch):
    class ApexFusedAdam(torch.optim.SGD):
        pass
    ApexFusedAdam.__module__, ApexFusedAdam.__qualname__ = "apex.optimizers.fused_adam", "FusedAdam"
    opt = ApexFusedAdam([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    opt._amp_stash = types.SimpleNamespace()
    opt._amp_lazy_init = lambda: None
    own = opt._post_amp_backward = lambda scaler: None
    with pytest.warns(UserWarning, match="keeps Apex's own fused unscale"):
        assert FP16_Optimizer(opt) is opt
    assert opt._post_amp_backward is own
