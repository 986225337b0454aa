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

Sync-free on CUDA: a step never waits for the device. The overflow flag and the gradient norm
stay device tensors, the loss scale is updated on the device (loss_scaler.py), and the skip happens
in the inner optimizer's kernels when it is torch_ort's FusedAdam or FusedLamb (step(found_inf=)).
Any other inner optimizer must know on the host whether to run: that is one read of the flag per
step. `overflow`, `last_grad_norm`, `loss_scale` and update_master_grads()'s result read the
device value when asked (a wait, on demand); `found_inf` is the step's flag as a device tensor
(0-dim float32, nonzero: skipped). The CPU keeps host values (nothing to wait for).

DeepSpeed ZeRO-1/2, legacy Megatron-LM, Apex AMP optimizers and accelerate's DeepSpeed wrapper are
not wrapped but patched in place with the fused kernels, as ONNX Runtime did (modifiers.py); they
come back as the same object. Anything else is returned unchanged, with a warning.
"""
from __future__ import annotations

import warnings
from typing import Callable, List, Optional

import torch

from .._compat import version_counter
from . import _kernels, modifiers
from .loss_scaler import LossScaler
from .master_weights import MasterWeights



class FP16_Optimizer(MasterWeights):
    """Mixed-precision wrapper of an optimizer: fp32 master weights, loss scaling, overflow skips."""

    def __new__(cls, optimizer=None, *args, **kwargs):
        if optimizer is None:  # copy/pickle protocols
            return super().__new__(cls)
        patched = modifiers.patch(optimizer, **{k: v for k, v in kwargs.items() if k in modifiers.KWARGS})
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
                 growth_interval: int = 2000, min_scale: float = 1.0, max_scale: float = 2.0 ** 24,
                 max_grad_norm: Optional[float] = None, **modifier_kwargs):
        unknown = set(modifier_kwargs) - set(modifiers.KWARGS)
        if unknown:
            raise TypeError(f"FP16_Optimizer got unexpected keyword arguments {sorted(unknown)}")
        if isinstance(optimizer, FP16_Optimizer):
            raise TypeError("FP16_Optimizer wraps an optimizer once; this one is already wrapped")
        self._wrapping = True            # inside torch.optim.Optimizer.__init__ (see param_groups)
        self.optimizer = optimizer
        if static_loss_scale is not None:
            self.scaler = LossScaler(static_loss_scale, dynamic=False)
        else:
            self.scaler = LossScaler(initial_scale, dynamic=dynamic_loss_scale,
                                     growth_factor=growth_factor, backoff_factor=backoff_factor,
                                     growth_interval=growth_interval, min_scale=min_scale,
                                     max_scale=max_scale)
        self.max_grad_norm = max_grad_norm
        self.model_params: List[torch.Tensor] = []   # fp16/bf16 parameters of the model
        self.master_params: List[torch.Tensor] = []  # their fp32 masters, in the inner optimizer
        self.fp32_params: List[torch.Tensor] = []    # fp32 parameters: their own masters
        for group in optimizer.param_groups:
            group["params"] = [self._master_of(p) for p in group["params"]]
        # Hooks and torch's bookkeeping; the groups it collects are dropped, the inner's are used.
        torch.optim.Optimizer.__init__(self, list(optimizer.param_groups), optimizer.defaults)
        self._wrapping = False
        self.__dict__.pop("_own_groups", None)
        self.overflow = False            # whether the last unscale found an inf or nan
        self.last_grad_norm = None       # the global norm clipping saw (None: no clipping)
        self._grads_ready = False        # masters hold this step's unscaled gradients
        self._scaled = False             # this step's gradients came through scale_loss/backward
        self._synced_versions = [version_counter(p) for p in self.model_params]

    # -- values that may live on the device (module doc) ------------------------------------------

    @property
    def overflow(self) -> bool:
        """Whether the last unscale found an inf or nan (reads the device flag on demand)."""
        value = self.__dict__.get("_overflow", False)
        return bool(value.item() != 0) if torch.is_tensor(value) else value

    @overflow.setter
    def overflow(self, value) -> None:
        self.__dict__["_overflow"] = value

    @property
    def found_inf(self) -> Optional[torch.Tensor]:
        """The last unscale's overflow flag as a device tensor (sync-free steps), else None."""
        value = self.__dict__.get("_overflow")
        return value if torch.is_tensor(value) else None

    @property
    def last_grad_norm(self) -> Optional[float]:
        value = self.__dict__.get("_last_grad_norm")
        return float(value.item()) if torch.is_tensor(value) else value

    @last_grad_norm.setter
    def last_grad_norm(self, value) -> None:
        self.__dict__["_last_grad_norm"] = value

    def _grad_device(self) -> Optional[torch.device]:
        for p in self.model_params + self.fp32_params:
            if p.grad is not None:
                return p.grad.device
        return None

    # -- the training-loop surface ---------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the current scale, in fp32 (for callers that run backward themselves)."""
        self._scaled = True
        return loss.float() * self.scaler.scale_for(loss.device)

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
        self._scaled = False

    def update_master_grads(self) -> bool:
        """Unscales this step's gradients into the masters' fp32 gradients, checking for inf/nan
        in the same pass. Returns (and sets) self.overflow."""
        self._unscale()
        return self.overflow

    @torch.no_grad()
    def clip_master_grads(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clips the masters' gradients to a global L2 norm of max_norm; returns the norm before
        clipping, or -1 when the gradients overflowed (the step will be skipped)."""
        if norm_type != 2:
            raise ValueError(f"FP16_Optimizer clips by the L2 norm only, got norm_type={norm_type}")
        if not self._grads_ready:
            self._unscale()
        if self.overflow:
            return -1.0
        grads = _kernels.Contiguous([p.grad for p in self.master_params + self.fp32_params
                                     if p.grad is not None])
        norm = _kernels.l2norm(grads.tensors)
        self.last_grad_norm = norm
        if norm > max_norm:
            _kernels.scale(grads.tensors, grads.tensors, max_norm / (norm + 1e-6))
            grads.write_back()
        return norm

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None):
        """One step. Everything that can be checked is checked before the gradients are unscaled:
        the model's gradients, and the inner optimizer's hyper-parameters when it is torch_ort's
        FusedAdam/FusedLamb (their check_step) — such a failure changes nothing and step() can be
        retried. Nothing is copied to undo a later failure: when the inner step raises after the
        unscale (out of memory, a kernel, a foreign optimizer's own checks), the gradients stay
        unscaled (and clipped) — the masters' and, in place, the fp32 parameters' — and the
        wrapper knows it: step() again retries with them without unscaling twice; zero_grad()
        drops them (do one of the two before the next backward). Multiplying back by the scale,
        a power of two, would be exact only for values that did not underflow: it is not done."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._grads_ready:
            self._check_grads()
        check_inner = getattr(self.optimizer, "check_step", None)
        if check_inner is not None:
            check_inner()
        if not self._grads_ready:
            self._unscale()  # checks first, then unscales: _grads_ready from here on
        self.last_grad_norm = None
        found = self.found_inf
        if found is not None:
            return self._step_on_device(found, loss)
        if self.overflow:
            self._grads_ready = self._scaled = False
            self.scaler.update(overflow=True)
            return loss
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            self.clip_master_grads(self.max_grad_norm)  # a retry clips again: a no-op then
        self.optimizer.step()
        self._grads_ready = self._scaled = False
        self._masters_to_model()
        self.scaler.update(overflow=False)
        return loss

    def _step_on_device(self, found: torch.Tensor, loss):
        """step() after a sync-free unscale: clipping, the inner step and the scale update all
        read `found` on the device; a skipped step leaves the masters as they were, so copying
        them to the model changes nothing."""
        if self.max_grad_norm is not None and self.max_grad_norm > 0:
            self._clip_on_device(self.max_grad_norm)
        if getattr(self.optimizer, "accepts_found_inf", False):
            self.optimizer.step(found_inf=found)
        elif not bool(found.item() != 0):  # a foreign optimizer cannot skip on the device
            self.optimizer.step()
        self._grads_ready = self._scaled = False
        self._masters_to_model()
        self.scaler.update_on_device(found)
        return loss

    @torch.no_grad()
    def _clip_on_device(self, max_norm: float) -> None:
        """clip_master_grads with the norm kept on the device: the factor is 1 where no clip."""
        grads = _kernels.Contiguous([p.grad for p in self.master_params + self.fp32_params
                                     if p.grad is not None])
        if not grads.tensors:
            return
        norm = _kernels.l2norm_tensor(grads.tensors)
        self.last_grad_norm = norm
        clip = torch.full_like(norm, max_norm).div(norm + 1e-6)
        factor = torch.where(norm > max_norm, clip, torch.ones_like(norm))
        _kernels.scale_flag(grads.tensors, grads.tensors, 1.0, None, scale_by=factor)
        grads.write_back()

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
        self._synced_versions = [-1] * len(self.model_params)  # compared by value at the next step

    def __getstate__(self):  # everything: the wrapped optimizer, the masters, the scaler
        return self.__dict__.copy()

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"FP16_Optimizer(scale={self.scaler.scale:g}, {self.optimizer!r})"

