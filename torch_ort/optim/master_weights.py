"""The fp32 master weights of FP16_Optimizer (fp16_optimizer.py): the inner optimizer steps fp32
copies of the model's fp16/bf16 parameters, and the model gets them rounded back after each step.
MasterWeights is FP16_Optimizer's base: it shows the inner optimizer's param_groups and state as
its own, so LR schedulers and checkpoints see one set of groups."""
from __future__ import annotations

import warnings

import torch

from .._compat import version_counter
from . import _kernels
from ._base import check_grad

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class MasterWeights(torch.optim.Optimizer):
    """The masters, and their gradients unscaled from the model's. Reads `optimizer` (the inner
    one), `model_params`, `master_params`, `fp32_params`, `_synced_versions`, `scaler` and
    `_scaled`, which FP16_Optimizer.__init__ sets, and sets `overflow` and `_grads_ready`."""

    # param_groups and state are the inner optimizer's, always — also after its load_state_dict
    # replaced them — so LR schedulers and checkpoints see one set of groups.
    @property
    def param_groups(self):
        if self.__dict__.get("_wrapping", True):
            return self.__dict__.setdefault("_own_groups", [])
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        if self.__dict__.get("_wrapping", True):
            self.__dict__["_own_groups"] = groups
        else:
            self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, value):
        if not self.__dict__.get("_wrapping", True):
            self.optimizer.state = value

    def add_param_group(self, param_group: dict) -> None:
        if self.__dict__.get("_wrapping", True):
            return super().add_param_group(param_group)  # the inner's own groups, already mastered
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        versions = len(self.model_params)
        param_group["params"] = [self._master_of(p) for p in params]
        self._synced_versions += [version_counter(p) for p in self.model_params[versions:]]
        self.optimizer.add_param_group(param_group)

    def _master_of(self, p: torch.Tensor) -> torch.Tensor:
        if p.dtype not in _LOW_PRECISION:
            self.fp32_params.append(p)
            return p
        # Contiguous whatever p's layout (channels_last, transposed): the kernels take dense rows.
        master = p.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        master.requires_grad_(p.requires_grad)
        state = self.optimizer.state.pop(p, None)
        if state:  # state the inner optimizer already had for p moves to the master, in fp32
            self.optimizer.state[master] = {k: v.float() if torch.is_tensor(v) and v.is_floating_point()
                                            and k != "step" else v for k, v in state.items()}
        self.model_params.append(p)
        self.master_params.append(master)
        return master

    def _refresh_changed_masters(self) -> None:
        """A model parameter written since the last step (load_state_dict, an init, an EMA) is the
        truth: its master is refreshed from it instead of overwriting it with a stale master."""
        changed = []
        for i, p in enumerate(self.model_params):
            if version_counter(p) == self._synced_versions[i]:
                continue
            self._synced_versions[i] = version_counter(p)
            # The model holding its master's rounding (a checkpoint of both) is no change.
            if not torch.equal(p.detach(), self.master_params[i].detach().to(p.dtype)):
                changed.append(i)
        if not changed:
            return
        warnings.warn(f"FP16_Optimizer: {len(changed)} fp16/bf16 parameter(s) changed outside the "
                      "optimizer since its last step; their fp32 masters were refreshed from them",
                      UserWarning, stacklevel=3)
        with torch.no_grad():
            for i in changed:
                self.master_params[i].copy_(self.model_params[i])

    @torch.no_grad()
    def _masters_to_model(self) -> None:
        model = _kernels.Contiguous(self.model_params)  # channels_last or transposed parameters
        _kernels.scale_flag(self.master_params, model.tensors, 1.0, None)  # no flag: never waits
        model.write_back()
        self._synced_versions = [version_counter(p) for p in self.model_params]

    @torch.no_grad()
    def _unscale(self) -> None:
        """update_master_grads without its answer: on a sync-free device the flag stays there."""
        if not self._scaled and any(p.grad is not None for p in self.model_params + self.fp32_params) \
                and self.scaler.scale != 1.0:
            raise RuntimeError(
                "FP16_Optimizer: these gradients did not come through optimizer.backward(loss) or "
                "optimizer.scale_loss(loss), so they are not multiplied by the loss scale "
                f"({self.scaler.scale:g}) that step() divides by; use one of those for backward "
                "(or static_loss_scale=1.0)")
        self._check_grads()
        self._refresh_changed_masters()
        src, dst = [], []
        for p, m in zip(self.model_params, self.master_params):
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_like(m)
            src.append(p.grad if p.grad.is_contiguous() else p.grad.contiguous())
            dst.append(m.grad)
        own = [p.grad for p in self.fp32_params if p.grad is not None]
        own_work = _kernels.Contiguous(own)
        device = self._grad_device()
        if device is not None and _kernels.sync_free(device):
            found = torch.zeros((), dtype=torch.float32, device=device)
            inv_t = self.scaler.inv_scale_tensor(device)
            _kernels.scale_flag(src, dst, 1.0, found, scale_by=inv_t)
            _kernels.scale_flag(own_work.tensors, own_work.tensors, 1.0, found, scale_by=inv_t)
            self.overflow = found
        else:
            inv = 1.0 / self.scaler.scale
            self.overflow = (_kernels.scale(src, dst, inv) |
                             _kernels.scale(own_work.tensors, own_work.tensors, inv))
        own_work.write_back()
        self._grads_ready = True

    def _check_grads(self) -> None:
        """Every model gradient the step reads, checked before anything is written (the fused
        optimizers' check: dense, its parameter's shape and device, dtype or fp32)."""
        for p in self.model_params + self.fp32_params:
            if p.grad is not None:
                check_grad("FP16_Optimizer", p, p.grad)
