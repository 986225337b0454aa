"""FP16_Optimizer: mixed-precision training for fp16/bf16 models with any optimizer.

Wrapping a plain torch.optim optimizer gives fp32 master weights for the model's fp16/bf16
parameters (the wrapped optimizer updates the masters; the model gets them rounded back after each
step), dynamic loss scaling (loss_scaler.py), and fused multi-tensor kernels for the slow parts:
unscaling fp16/bf16 gradients into fp32 ones together with the inf/nan check, and the global
gradient norm for clipping. A step whose gradients overflowed is skipped: parameters, masters and
optimizer state are left as they were, and the scale goes down.

    optimizer = FP16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4), max_grad_norm=1.0)
    optimizer.zero_grad()
    optimizer.backward(loss)        # (loss · scale).backward()
    optimizer.step()                # unscale + check, clip, inner step, masters -> model

DeepSpeed ZeRO-1/2, legacy Megatron-LM, Apex AMP optimizers and accelerate's DeepSpeed wrapper are
not wrapped but patched in place with the fused kernels, as ONNX Runtime did (modifiers.py); they
come back as the same object. Anything else is returned unchanged, with a warning.
"""
from __future__ import annotations

import warnings
from typing import Callable, List, Optional

import torch

from . import _kernels, modifiers
from .loss_scaler import LossScaler

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class FP16_Optimizer(torch.optim.Optimizer):
    def __new__(cls, optimizer, *args, **kwargs):
        patched = modifiers.patch(optimizer, **kwargs)
        if patched is not None:
            return patched  # not an FP16_Optimizer: __init__ does not run
        if not isinstance(optimizer, torch.optim.Optimizer):
            warnings.warn(f"FP16_Optimizer: {type(optimizer).__module__}.{type(optimizer).__qualname__} "
                          "is neither a torch.optim.Optimizer nor an optimizer torch_ort knows how to "
                          "patch (DeepSpeed ZeRO-1/2, Megatron-LM, Apex AMP, accelerate); returned "
                          "unchanged", UserWarning, stacklevel=2)
            return optimizer
        return super().__new__(cls)

    def __init__(self, optimizer: torch.optim.Optimizer, static_loss_scale: Optional[float] = None,
                 dynamic_loss_scale: bool = True, initial_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 1.0,
                 max_grad_norm: Optional[float] = None, **_modifier_kwargs):
        if isinstance(optimizer, FP16_Optimizer):
            raise TypeError("FP16_Optimizer wraps an optimizer once; this one is already wrapped")
        self.optimizer = optimizer
        if static_loss_scale is not None:
            self.scaler = LossScaler(static_loss_scale, dynamic=False)
        else:
            self.scaler = LossScaler(initial_scale, dynamic=dynamic_loss_scale,
                                     growth_factor=growth_factor, backoff_factor=backoff_factor,
                                     growth_interval=growth_interval, min_scale=min_scale)
        self.max_grad_norm = max_grad_norm
        self.model_params: List[torch.Tensor] = []   # fp16/bf16 parameters of the model
        self.master_params: List[torch.Tensor] = []  # their fp32 masters, in the inner optimizer
        self.fp32_params: List[torch.Tensor] = []    # fp32 parameters: their own masters
        for group in optimizer.param_groups:
            group["params"] = [self._master_of(p) for p in group["params"]]
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups  # one list: LR schedulers reach the inner groups
        self.state = optimizer.state
        self.overflow = False            # whether the last unscale found an inf or nan
        self.last_grad_norm: Optional[float] = None
        self._grads_ready = False        # masters hold this step's unscaled gradients

    def _master_of(self, p: torch.Tensor) -> torch.Tensor:
        if p.dtype not in _LOW_PRECISION:
            self.fp32_params.append(p)
            return p
        master = p.detach().clone().float().requires_grad_(p.requires_grad)
        state = self.optimizer.state.pop(p, None)
        if state:  # state the inner optimizer already had for p moves to the master, in fp32
            self.optimizer.state[master] = {k: v.float() if torch.is_tensor(v) and v.is_floating_point()
                                            and k != "step" else v for k, v in state.items()}
        self.model_params.append(p)
        self.master_params.append(master)
        return master

    # -- the training-loop surface ---------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the current scale, in fp32 (for callers that run backward themselves)."""
        return loss.float() * self.scaler.scale

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        self._grads_ready = False
        self.scale_loss(loss).backward(retain_graph=retain_graph)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params + self.fp32_params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()
        for m in self.master_params:
            m.grad = None
        self._grads_ready = False

    @torch.no_grad()
    def update_master_grads(self) -> bool:
        """Unscales this step's gradients into the masters' fp32 gradients, checking for inf/nan
        in the same pass. Returns (and sets) self.overflow."""
        inv = 1.0 / self.scaler.scale
        src, dst = [], []
        for p, m in zip(self.model_params, self.master_params):
            if p.grad is None:
                m.grad = None
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"FP16_Optimizer: sparse gradient for a parameter of shape {tuple(p.shape)}")
            if m.grad is None:
                m.grad = torch.empty_like(m)
            src.append(p.grad if p.grad.is_contiguous() else p.grad.contiguous())
            dst.append(m.grad)
        own = [p.grad for p in self.fp32_params if p.grad is not None]
        if any(g.is_sparse for g in own):
            raise RuntimeError("FP16_Optimizer: sparse gradients are not supported")
        own_work = _kernels.Contiguous(own)
        self.overflow = _kernels.scale(src, dst, inv) | _kernels.scale(own_work.tensors, own_work.tensors, inv)
        own_work.write_back()
        self._grads_ready = True
        return self.overflow

    @torch.no_grad()
    def clip_master_grads(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clips the masters' gradients to a global L2 norm of max_norm; returns the norm before
        clipping, or -1 when the gradients overflowed (the step will be skipped)."""
        if norm_type != 2:
            raise ValueError(f"FP16_Optimizer clips by the L2 norm only, got norm_type={norm_type}")
        if not self._grads_ready:
            self.update_master_grads()
        if self.overflow:
            return -1.0
        grads = [p.grad for p in self.master_params + self.fp32_params if p.grad is not None]
        norm = _kernels.l2norm(grads)
        self.last_grad_norm = norm
        if norm > max_norm:
            _kernels.scale(grads, grads, max_norm / (norm + 1e-6))
        return norm

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._grads_ready:
            self.update_master_grads()
        self._grads_ready = False
        if self.overflow:
            self.scaler.update(overflow=True)
            return loss
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            self._grads_ready = True
            self.clip_master_grads(self.max_grad_norm)
            self._grads_ready = False
        self.optimizer.step()
        with torch.no_grad():
            _kernels.scale(self.master_params, self.model_params, 1.0)
        self.scaler.update(overflow=False)
        return loss

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "loss_scaler": self.scaler.state_dict(),
                "fp32_master_params": [m.detach() for m in self.master_params],
                "overflow": self.overflow}

    def load_state_dict(self, state_dict: dict) -> None:
        masters = state_dict["fp32_master_params"]
        if len(masters) != len(self.master_params) or any(
                a.shape != b.shape for a, b in zip(masters, self.master_params)):
            raise ValueError("FP16_Optimizer.load_state_dict: the saved fp32 masters "
                             f"({len(masters)} tensors) do not match this model's fp16/bf16 "
                             f"parameters ({len(self.master_params)})")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.scaler.load_state_dict(state_dict["loss_scaler"])
        with torch.no_grad():
            for m, saved in zip(self.master_params, masters):
                m.copy_(saved)
        self.overflow = state_dict.get("overflow", False)
        self._grads_ready = False

    def __repr__(self) -> str:
        return f"FP16_Optimizer(scale={self.scaler.scale:g}, {self.optimizer!r})"

