"""FusedLamb: LAMB (You et al., "Large Batch Optimization for Deep Learning") with multi-tensor
kernels, as NVIDIA's and ONNX Runtime's implementations define it.

With t the group's step, bc1 = 1-β1^t and bc2 = 1-β2^t (1 without bias correction):

    global clipping: n = ‖all gradients of all groups‖;  g ← g / max(1, n / max_grad_norm)
                     (skipped when max_grad_norm is None or <= 0)
    L2 mode (adam_w_mode=False): g ← g + wd·p
    m ← β1·m + β3·g   (β3 = 1-β1 with grad_averaging, else 1)      v ← β2·v + (1-β2)·g²
    u = (m/bc1) / (√(v/bc2) + eps);   decoupled mode (adam_w_mode=True): u ← u + wd·p
    per tensor: w = ‖p‖ (clamped to max_weight_norm when given), r = ‖u‖
                ratio = w/r if w > 0 and r > 0 else 1   — applied only when wd ≠ 0 or use_nvlamb,
                otherwise ratio = 1; then clipped to [ratio_min, ratio_max]
    p ← p - lr·ratio·u

A non-finite global gradient norm raises before any parameter or state is touched — on the
CPU. On CUDA a step never waits for the device (optim/_kernels.py): the global norm, the clipping
factor and the skip flag stay device tensors that the kernels read, so a non-finite norm (or a set
`found_inf`) makes the kernels skip the update instead: nothing changes, the group's `step` (a
device tensor there) does not advance, and `last_step_skipped` / `skip_flag` say so.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

import torch

from . import _kernels
from ._base import FusedOptimizer, check_hyper


class FusedLamb(FusedOptimizer):
    """LAMB (layer-wise adaptive Adam) over all parameters in fused multi-tensor kernels."""

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True,
                 betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 adam_w_mode: bool = True, grad_averaging: bool = True,
                 max_grad_norm: Optional[float] = 1.0, use_nvlamb: bool = False,
                 ratio_min: float = 0.0, ratio_max: float = math.inf,
                 max_weight_norm: Optional[float] = None, set_grad_none: bool = True):
        check_hyper(lr, betas, eps, weight_decay)
        if ratio_min > ratio_max or ratio_min < 0:
            raise ValueError(f"invalid trust-ratio bounds [{ratio_min}, {ratio_max}]")
        if max_weight_norm is not None and max_weight_norm <= 0:
            raise ValueError(f"invalid max_weight_norm {max_weight_norm}: must be > 0 or None")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=adam_w_mode,
                        grad_averaging=grad_averaging, use_nvlamb=use_nvlamb, ratio_min=ratio_min,
                        ratio_max=ratio_max, max_weight_norm=max_weight_norm)
        self.max_grad_norm = max_grad_norm
        super().__init__(params, defaults, set_grad_none)

    EXTRA = FusedOptimizer.EXTRA + ("max_grad_norm",)

    def hyper(self, group: dict, step: int, grad_scale: float) -> dict:
        beta1, beta2 = (float(b) for b in group["betas"])
        max_weight_norm = group["max_weight_norm"]
        ratio_min, ratio_max = float(group["ratio_min"]), float(group["ratio_max"])
        if ratio_min > ratio_max or ratio_min < 0:
            raise ValueError(f"invalid trust-ratio bounds [{ratio_min}, {ratio_max}]")
        return dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), step=step,
                    bias_correction=bool(group["bias_correction"]),
                    adam_w_mode=bool(group["adam_w_mode"]), grad_averaging=bool(group["grad_averaging"]),
                    use_nvlamb=bool(group["use_nvlamb"]), ratio_min=ratio_min,
                    ratio_max=min(ratio_max, 1e30),
                    max_weight_norm=-1.0 if max_weight_norm is None else float(max_weight_norm),
                    grad_scale=float(grad_scale))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None, *, grad_scale: float = 1.0,
             found_inf: Optional[torch.Tensor] = None):
        """One update. `grad_scale` multiplies every gradient before clipping (1: none).
        `found_inf` (a one-element tensor, e.g. FP16_Optimizer's overflow flag): nonzero skips."""
        loss = self.run_closure(closure)
        work = self.checked_groups("FusedLamb")
        device = self.sync_free_device(work)
        if device is not None:
            self._step_on_device(work, device, grad_scale, found_inf)
            return loss
        if self.host_skip(found_inf):
            return loss
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            norm = _kernels.l2norm([g for _, _, grads in work for g in grads]) * grad_scale
            if not math.isfinite(norm):
                raise FloatingPointError(
                    f"FusedLamb: the global gradient norm is {norm}; no parameter was updated "
                    "(check the loss, or let FP16_Optimizer skip overflowing steps)")
            grad_scale /= max(1.0, norm / self.max_grad_norm)

        def prepare(group, step):  # every value read and checked before any group moves
            hyper = self.hyper(group, step, grad_scale)
            return lambda backend, ps, gs, ms, vs: backend.multi_tensor_lamb(ps, gs, ms, vs, **hyper)

        self.run_groups(work, prepare)
        return loss

    def _step_on_device(self, work, device: torch.device, grad_scale: float, found_inf) -> None:
        """step() with no host read: the norm, the clipping factor and the skip flag are device
        tensors (the host path's values, computed with the same float64 operations)."""
        skip = self.flag_on(found_inf, device)
        scale_by = None
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            norm = _kernels.l2norm_tensor([g for _, _, grads in work for g in grads]).to(device) * grad_scale
            bad = (~torch.isfinite(norm)).to(torch.float32)
            skip = bad if skip is None else torch.maximum(skip, bad)
            # grad_scale / max(1, norm / max_grad_norm), as true divisions (a tensor divided by a
            # Python number may be computed as a multiplication by its reciprocal)
            ratio = torch.clamp(norm.div(torch.full_like(norm, self.max_grad_norm)), min=1.0)
            scale_by = torch.full_like(norm, grad_scale).div(ratio)
            grad_scale = 1.0
        self.__dict__.update(skip_flag=skip, _skipped_host=False)

        def prepare(group, step):
            hyper = self.hyper(group, 1, grad_scale)
            return lambda backend, ps, gs, ms, vs: backend.multi_tensor_lamb(
                ps, gs, ms, vs, **hyper, scale_by=scale_by, skip=skip, step_tensor=step)

        self.run_groups(work, prepare, skip=skip, device_steps=True)
