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
    assert {"multi_tensor_adam", "multi_tensor_lamb", "multi_tensor_scale", "multi_tensor_l2norm"} <= set(dir(module))


@pytest.mark.skipif(not HAS_NVCC, reason="no CUDA toolkit: torch_ort._C_cuda is not built")
def test_cuda_kernels_refuse_cpu_tensors_by_name():
    with pytest.raises(TypeError, match=r"multi_tensor_adam: params\[0\] is on cpu, this kernel runs on CUDA"):
        cuda_module().multi_tensor_adam([torch.ones(2)], [torch.ones(2)], [torch.zeros(2)], [torch.zeros(2)],
                                        lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1,
                                        bias_correction=True, adam_w_mode=1)
    with pytest.raises(TypeError, match=r"multi_tensor_l2norm: tensors\[0\] is on cpu"):
        cuda_module().multi_tensor_l2norm([torch.ones(2)])


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
