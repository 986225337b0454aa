"""FusedAdam: Adam/AdamW over every parameter of a group in one multi-tensor kernel call.

The three update rules (ONNX Runtime's AdamWMode), with t the group's step, bc1 = 1-β1^t and
bc2 = 1-β2^t (both 1 without bias correction), and every gradient first multiplied by nothing
(FusedAdam) or by FP16_Optimizer's unscale factor:

    m ← β1·m + (1-β1)·g            v ← β2·v + (1-β2)·g²
    ADAM_L2_REGULARIZATION (0): g ← g + wd·p first;  p ← p - lr·(√bc2/bc1)·m/(√v + eps)
    ADAMW_TRANSFORMERS     (1): p ← p - lr·(√bc2/bc1)·m/(√v + eps);  then p ← p·(1 - lr·wd)
    ADAMW_TORCH            (2): p ← p·(1 - lr·wd) first;  p ← p - (lr/bc1)·m/(√v/√bc2 + eps)

Mode 2 is torch.optim.AdamW's rule; mode 0 is torch.optim.Adam(weight_decay=wd) except that eps
is added to √v rather than to √v/√bc2.

The defaults are torch.optim.AdamW's (ADAMW_TORCH, eps=1e-8, weight_decay=0.01), so that
`FusedAdam(model.parameters(), lr=...)` replaces `torch.optim.AdamW(model.parameters(), lr=...)`
with the same update. ONNX Runtime's FusedAdam defaulted to ADAMW_TRANSFORMERS, eps=1e-6,
weight_decay=0.0: a script migrated from it passes those three to keep its update. Parameters may be fp32, fp16 or bf16; the moments are
fp32 and the math is fp32, a low-precision parameter being rounded (to nearest even) once per step.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Callable, Iterable, Optional

import torch

from ._base import FusedOptimizer, check_hyper


class AdamWMode(IntEnum):
    """Where FusedAdam applies weight decay (ORT's adam_w_mode values)."""

    ADAM_L2_REGULARIZATION = 0  # Adam with L2 regularization (decay added to the gradient)
    ADAMW_TRANSFORMERS = 1      # Hugging Face transformers' AdamW (decoupled decay after the step)
    ADAMW_TORCH = 2             # torch.optim.AdamW (decoupled decay before the step)


class FusedAdam(FusedOptimizer):
    """Adam/AdamW (see AdamWMode) with one fused multi-tensor kernel per group and device.
    Called like torch.optim.AdamW, it makes torch.optim.AdamW's update (its defaults are AdamW's).

    Hyper-parameters may differ per group (lr, betas, eps, weight_decay, bias_correction,
    adam_w_mode); each group counts its own `step`, as ONNX Runtime and Apex do (torch.optim.AdamW
    counts per parameter: the two differ for a parameter whose first gradient comes late). `zero_grad()` sets gradients to None when
    `set_grad_none` (the default)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, bias_correction: bool = True,
                 betas=(0.9, 0.999), eps: float = 1e-8,
                 adam_w_mode: AdamWMode = AdamWMode.ADAMW_TORCH, weight_decay: float = 1e-2,
                 set_grad_none: bool = True):
        check_hyper(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=int(AdamWMode(adam_w_mode)))
        self.adam_w_mode = AdamWMode(adam_w_mode)
        super().__init__(params, defaults, set_grad_none)

    EXTRA = FusedOptimizer.EXTRA + ("adam_w_mode",)

    def add_param_group(self, param_group: dict) -> None:
        # Stored as a plain int: a state_dict holding an enum needs weights_only=False to load.
        if "adam_w_mode" in param_group:
            param_group["adam_w_mode"] = int(AdamWMode(param_group["adam_w_mode"]))
        super().add_param_group(param_group)

    def hyper(self, group: dict, step: int, grad_scale: float) -> dict:
        beta1, beta2 = (float(b) for b in group["betas"])
        return dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), step=step,
                    bias_correction=bool(group["bias_correction"]),
                    adam_w_mode=int(AdamWMode(group["adam_w_mode"])), grad_scale=float(grad_scale))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None, *, grad_scale: float = 1.0,
             found_inf: Optional[torch.Tensor] = None):
        """One update of every parameter with a gradient. `grad_scale` multiplies every gradient
        first (1: none). `found_inf` (a one-element tensor, e.g. FP16_Optimizer's overflow flag):
        nonzero skips the step. On a sync-free device (CUDA) the kernels read it where they run
        and each group's `step` becomes a device tensor that skipped steps do not advance."""
        loss = self.run_closure(closure)
        work = self.checked_groups("FusedAdam")
        device = self.sync_free_device(work)
        if device is not None and (found_inf is not None or any(
                torch.is_tensor(group.get("step")) for group in self.param_groups)):
            skip = self.flag_on(found_inf, device)
            self.__dict__.update(skip_flag=skip, _skipped_host=False)

            def prepare_device(group, step):
                hyper = self.hyper(group, 1, grad_scale)
                return lambda backend, ps, gs, ms, vs: backend.multi_tensor_adam(
                    ps, gs, ms, vs, **hyper, skip=skip, step_tensor=step)

            self.run_groups(work, prepare_device, skip=skip, device_steps=True)
            return loss
        if self.host_skip(found_inf):
            return loss

        def prepare(group, step):  # every value read and checked before any group moves
            hyper = self.hyper(group, step, grad_scale)
            return lambda backend, ps, gs, ms, vs: backend.multi_tensor_adam(ps, gs, ms, vs, **hyper)

        self.run_groups(work, prepare)
        return loss
