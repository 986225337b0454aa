"""The multi-tensor kernels behind torch_ort.optim, picked by device: torch_ort._C on the CPU,
torch_ort._C_cuda (built when the CUDA toolkit was present) on CUDA. Both expose the same
functions: multi_tensor_adam, multi_tensor_lamb, multi_tensor_scale, multi_tensor_l2norm, and the
sync-free pair multi_tensor_scale_flag and multi_tensor_l2norm_tensor.

Sync-free steps. On CUDA, FusedLamb and FP16_Optimizer never read a value back from the device
within a step: the global norm and the found-inf flag stay device tensors (StepScalars in
csrc/runtime/kernels/multi_tensor.h) that the update kernels read where they run. On the CPU there
is nothing to wait for, and the host path (a float, a bool) runs; SYNC_FREE_ON_CPU = True makes
the CPU take the device path too (tests: the same logic, checked without a GPU)."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import torch

_cpu = _cuda = None  # the kernel modules, loaded on first use (checked against the running torch)

SYNC_FREE_ON_CPU = False


def sync_free(device: torch.device) -> bool:
    """Whether a step on `device` keeps its norm and overflow flag on the device (module doc)."""
    return device.type == "cuda" or (SYNC_FREE_ON_CPU and device.type == "cpu")


def backend(device: torch.device):
    """The kernel module for tensors on `device`; a clear error where there is none."""
    if device.type == "cpu":
        global _cpu
        if _cpu is None:
            from .. import _C
            _cpu = _C
        return _cpu
    if device.type == "cuda":
        global _cuda
        if _cuda is None:
            from .._extension import TorchVersionError
            try:
                from .. import _C_cuda
            except TorchVersionError:
                raise
            except ImportError as e:
                raise RuntimeError(
                    "torch_ort.optim has no CUDA kernels in this build: torch_ort._C_cuda was not "
                    "built (the CUDA toolkit was missing when torch_ort was compiled). Rebuild with "
                    "nvcc on PATH (scripts/bootstrap.sh) or keep the parameters on the CPU.") from e
            _cuda = _C_cuda
        return _cuda
    raise RuntimeError(f"torch_ort.optim has no kernels for {device.type} tensors (cpu and cuda only)")


def by_device(*lists: Sequence[torch.Tensor]) -> Dict[torch.device, List[List[torch.Tensor]]]:
    """Splits parallel lists by the device of their first list's tensors, keeping order."""
    out: Dict[torch.device, List[List[torch.Tensor]]] = OrderedDict()
    for row in zip(*lists):
        cols = out.setdefault(row[0].device, [[] for _ in lists])
        for col, t in zip(cols, row):
            col.append(t)
    return out


def l2norm(tensors: Sequence[torch.Tensor]) -> float:
    """√(Σ‖t‖²) over every tensor, on whatever devices they are (fused per device)."""
    total = 0.0
    for device, (ts,) in by_device(tensors).items():
        total += backend(device).multi_tensor_l2norm(ts) ** 2
    return math.sqrt(total)


def scale(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor], factor: float) -> bool:
    """dst = src·factor (dtype converted, dst may be src); True when src held an inf or nan."""
    found = False
    for device, (s, d) in by_device(src, dst).items():
        found |= backend(device).multi_tensor_scale(s, d, factor)
    return found


class Contiguous:
    """Contiguous stand-ins for tensors the kernels cannot take as they are (a transposed
    parameter, a channels-last one): the kernel updates the stand-in, `write_back` copies it
    home. Contiguous tensors stand for themselves at no cost."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.originals = list(tensors)
        self.tensors = [t if t.is_contiguous() else t.contiguous() for t in self.originals]

    def write_back(self) -> None:
        for orig, t in zip(self.originals, self.tensors):
            if t is not orig:
                orig.copy_(t)


def has_nonfinite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any element is inf or nan: one fused read-only pass (the L2 norm of finite fp32,
    fp16 or bf16 values, summed in double, cannot overflow)."""
    return not math.isfinite(l2norm(tensors))


def l2norm_tensor(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """l2norm as a 0-dim float64 tensor on the first tensor's device: no host read. The same
    value l2norm returns (√ of the sum of each device's squared norm)."""
    parts = [backend(device).multi_tensor_l2norm_tensor(ts) for device, (ts,) in by_device(tensors).items()]
    if not parts:
        return torch.zeros((), dtype=torch.float64)
    first = parts[0].device
    return torch.stack([p.to(first) for p in parts]).square().sum().sqrt()


def scale_flag(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor], factor: float,
               found: torch.Tensor, scale_by: Optional[torch.Tensor] = None) -> None:
    """scale, without a host answer: dst = src·factor·scale_by, and found (one float32 element on
    the tensors' device) set to 1 when src held an inf or nan (never cleared here)."""
    for device, (s, d) in by_device(src, dst).items():
        backend(device).multi_tensor_scale_flag(s, d, factor, found=found, scale_by=scale_by)
