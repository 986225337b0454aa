"""The CUDA multi-tensor kernels (torch_ort._C_cuda). This machine class compiles CUDA but has no
GPU: the build and the argument checks are tested everywhere; the numerics against the CPU
kernels only where a GPU is present."""
import os

import pytest
import torch
from torch.utils.cpp_extension import CUDA_HOME

HAS_NVCC = CUDA_HOME is not None and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


def cuda_module():
    import torch_ort._C_cuda as module
    return module


@pytest.mark.skipif(not HAS_NVCC, reason="no CUDA toolkit: torch_ort._C_cuda is not built")
def test_cuda_kernels_are_built_when_the_toolkit_is_present():
    module = cuda_module()  # scripts/bootstrap.sh built it: nvcc compiled multi_tensor.cu
    assert {"multi_tensor_adam", "multi_tensor_lamb", "multi_tensor_scale", "multi_tensor_l2norm",
            "multi_tensor_scale_flag", "multi_tensor_l2norm_tensor"} <= set(dir(module))


@pytest.mark.skipif(not HAS_NVCC, reason="no CUDA toolkit: torch_ort._C_cuda is not built")
def test_cuda_kernels_refuse_cpu_tensors_by_name():
    with pytest.raises(TypeError, match=r"multi_tensor_adam: params\[0\] is on cpu, this kernel runs on CUDA"):
        cuda_module().multi_tensor_adam([torch.ones(2)], [torch.ones(2)], [torch.zeros(2)], [torch.zeros(2)],
                                        lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1,
                                        bias_correction=True, adam_w_mode=1)
    with pytest.raises(TypeError, match=r"multi_tensor_l2norm: tensors\[0\] is on cpu"):
        cuda_module().multi_tensor_l2norm([torch.ones(2)])
    with pytest.raises(TypeError, match=r"multi_tensor_scale_flag: src\[0\] is on cpu"):
        cuda_module().multi_tensor_scale_flag([torch.ones(2)], [torch.ones(2)], 1.0, found=torch.zeros(()))
    with pytest.raises(TypeError, match=r"multi_tensor_l2norm_tensor: tensors\[0\] is on cpu"):
        cuda_module().multi_tensor_l2norm_tensor([torch.ones(2)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (this machine class has none)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_optimizers_match_the_cpu_kernels(dtype):
    from torch_ort.optim import FusedAdam, FusedLamb
    gen = torch.Generator().manual_seed(0)
    # > 36 tensors, tensors over one chunk, an empty one, and one of more than 320 chunks (its
    # chunks span two launches).
    shapes = [(70000,), (37,), (300, 5), (0,)] * 12 + [(320 * 65536 + 7,)]
    cpu = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]
    gpu = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
    for make in (lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1, adam_w_mode=2),
                 lambda ps: FusedLamb(ps, lr=1e-2),
                 lambda ps: FusedLamb(ps, lr=1e-2, max_weight_norm=3.0, ratio_min=0.5, ratio_max=2.0)):
        a, b = make(cpu), make(gpu)
        for _ in range(5):
            for pc, pg in zip(cpu, gpu):
                pc.grad = torch.randn(pc.shape, generator=gen).to(dtype)
                pg.grad = pc.grad.cuda()
            a.step()
            b.step()
        for pc, pg in zip(cpu, gpu):
            torch.testing.assert_close(pg.detach().cpu().float(), pc.detach().float(), rtol=1e-5, atol=1e-5)
    grads = [p.grad for p in gpu]
    from torch_ort.optim import _kernels
    norm = _kernels.l2norm(grads)
    assert norm == _kernels.l2norm(grads)  # per-block partials added in a fixed order
    assert norm == pytest.approx(_kernels.l2norm([p.grad for p in cpu]), rel=1e-12)
    # The scale kernel: the CPU kernel's values, and the overflow flag only where there is one.
    scaled, scaled_cpu = [torch.empty_like(g) for g in grads], [torch.empty_like(p.grad) for p in cpu]
    assert _kernels.scale(grads, scaled, 0.5) is False
    assert _kernels.scale([p.grad for p in cpu], scaled_cpu, 0.5) is False
    for g, c in zip(scaled, scaled_cpu):
        torch.testing.assert_close(g.cpu(), c)
    grads[2][7, 3] = float("inf")  # shapes[2] is (300, 5); shapes[3] is (0,), nothing to overflow
    assert _kernels.scale(grads, grads, 0.5) is True
    grads[2].zero_()
    grads[-1][-1] = float("nan")  # the last chunk of the 321-chunk tensor: the second launch's
    assert _kernels.scale(grads, scaled, 0.5) is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (this machine class has none)")
def test_cuda_sync_free_kernels_match_the_host_answers():
    """multi_tensor_l2norm_tensor and multi_tensor_scale_flag: the values of the host-answer
    kernels, kept on the device."""
    from torch_ort.optim import _kernels
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(s, generator=gen).cuda() for s in [(70000,), (37,), (0,), (300, 5)]]
    assert _kernels.l2norm_tensor(ts).item() == _kernels.l2norm(ts)
    found = torch.zeros((), device="cuda")
    out = [torch.empty_like(t) for t in ts]
    factor = torch.full((), 0.25, dtype=torch.float64, device="cuda")
    _kernels.scale_flag(ts, out, 2.0, found, scale_by=factor)
    for a, b in zip(out, ts):
        torch.testing.assert_close(a, b * 0.5)
    assert found.item() == 0
    ts[3][1, 1] = float("inf")
    _kernels.scale_flag(ts, out, 1.0, found)
    assert found.item() == 1


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))


def _fp16_steps(model, opt, steps, overflow_at, sync_debug, drop=None):
    """Steps of an optimizer on `model`; the step in overflow_at gets an inf loss, batch `drop`
    is left out. With sync_debug, every step after the first two runs under
    set_sync_debug_mode("error")."""
    from torch_ort.optim import FP16_Optimizer
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)) for _ in range(steps)]
    batches = [(x.to(device, dtype), y.to(device)) for k, (x, y) in enumerate(batches) if k != drop]
    for k, (x, y) in enumerate(batches):
        strict = sync_debug and k >= 2
        if strict:
            torch.cuda.set_sync_debug_mode("error")
        try:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
            if k == overflow_at:
                loss = loss * float("inf")
            if isinstance(opt, FP16_Optimizer):
                opt.backward(loss)
            else:
                loss.backward()
            opt.step()
        finally:
            if strict:
                torch.cuda.set_sync_debug_mode("default")
    return [p.detach().float().cpu() for p in model.parameters()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (this machine class has none)")
@pytest.mark.parametrize("inner", ["fused_adam", "fused_lamb"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp16_optimizer_steps_never_wait_for_the_gpu(inner, dtype):
    """Steady steps, an overflowing one included, under set_sync_debug_mode("error"): no host
    read in zero_grad, backward, the unscale, clipping, the inner step or the scale update. The
    result is the CPU's (host path) to rounding, the skipped step and the scale included."""
    from torch_ort.optim import FP16_Optimizer, FusedAdam, FusedLamb
    make = {"fused_adam": lambda ps: FusedAdam(ps, lr=1e-3), "fused_lamb": lambda ps: FusedLamb(ps, lr=1e-3)}[inner]
    runs = {}
    for device in ("cpu", "cuda"):
        model = _mlp().to(device, dtype)
        opt = FP16_Optimizer(make(model.parameters()), max_grad_norm=1.0, initial_scale=2.0 ** 12,
                             growth_interval=3)
        params = _fp16_steps(model, opt, 8, overflow_at=4, sync_debug=device == "cuda")
        runs[device] = (params, opt.loss_scale, opt.scaler.skipped_steps, opt.optimizer.param_groups[0]["step"])
    (cpu, cpu_scale, cpu_skipped, cpu_step), (gpu, gpu_scale, gpu_skipped, gpu_step) = runs["cpu"], runs["cuda"]
    assert (gpu_scale, gpu_skipped) == (cpu_scale, cpu_skipped) and cpu_skipped == 1
    assert float(gpu_step) == cpu_step == 7  # the skipped step does not count
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (this machine class has none)")
def test_fused_lamb_steps_never_wait_for_the_gpu_and_skip_a_non_finite_norm():
    """On CUDA a non-finite gradient norm skips the step (the CPU raises): the result is the CPU
    run without that batch, and the skipped step does not count."""
    from torch_ort.optim import FusedLamb
    model = _mlp().cuda()
    opt = FusedLamb(model.parameters(), lr=1e-3, max_grad_norm=1.0)
    params = _fp16_steps(model, opt, 6, overflow_at=3, sync_debug=True)
    assert opt.param_groups[0]["step"].item() == 5 and not opt.last_step_skipped
    cpu_model = _mlp()
    cpu_opt = FusedLamb(cpu_model.parameters(), lr=1e-3, max_grad_norm=1.0)
    cpu_params = _fp16_steps(cpu_model, cpu_opt, 6, overflow_at=None, sync_debug=False, drop=3)
    assert cpu_opt.param_groups[0]["step"] == 5
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
