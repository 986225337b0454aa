"""Dynamic loss scaling for fp16/bf16 training: the loss is multiplied by `scale` before backward
so small gradients survive fp16; a step whose gradients hold an inf or nan is skipped and the scale
shrinks (× backoff_factor, not below min_scale); after `growth_interval` clean steps in a row it
grows (× growth_factor, not above max_scale). A static scaler never changes its scale.

On a device where steps are sync-free (CUDA; optim/_kernels.py), the scale, the count of clean
steps and the count of skipped steps live on the device from the first update_on_device() on, and
are updated there as torch.amp.GradScaler updates its scale (torch._amp_update_scale_, in float32),
so the host never waits for a step's overflow flag. Reading `scale`, `good_steps` or
`skipped_steps` then copies the value to the host (a wait, on demand only); the warning for
overflows at the minimum scale needs the host and is not given there."""
from __future__ import annotations

import warnings
from typing import Optional, Union

import torch

_FIELDS = ("scale", "dynamic", "growth_factor", "backoff_factor", "growth_interval", "min_scale",
           "max_scale", "good_steps", "skipped_steps")


class LossScaler:
    """Static or dynamic loss scale: backs off on overflow, grows after a clean interval."""

    def __init__(self, initial_scale: float = 2.0 ** 16, dynamic: bool = True,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 1.0, max_scale: float = 2.0 ** 24):
        if initial_scale <= 0:
            raise ValueError(f"loss scale must be > 0, got {initial_scale}")
        if dynamic and not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0 and growth_interval >= 1):
            raise ValueError("dynamic loss scaling needs growth_factor > 1, 0 < backoff_factor < 1 "
                             f"and growth_interval >= 1 (got {growth_factor}, {backoff_factor}, "
                             f"{growth_interval})")
        if not 0.0 < min_scale <= max_scale:
            raise ValueError(f"loss scale bounds must satisfy 0 < min_scale <= max_scale, got "
                             f"[{min_scale}, {max_scale}]")
        self._device: Optional[dict] = None  # scale, tracker, skipped as device tensors (module doc)
        self._scale = float(initial_scale)
        self.dynamic = dynamic
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.max_scale = max_scale
        self._good_steps = 0       # clean steps since the last change of scale
        self._skipped_steps = 0    # steps skipped for overflow, in all

    # -- the values, wherever they live ------------------------------------------------------------
    def _to_host(self) -> None:
        """Copies the device state back (a wait) and leaves device mode."""
        d, self._device = self._device, None
        if d is not None:
            self._scale = float(d["scale"].item())
            self._good_steps = int(d["tracker"].item())
            self._skipped_steps = int(d["skipped"].item())

    @property
    def scale(self) -> float:
        return float(self._device["scale"].item()) if self._device is not None else self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._to_host()
        self._scale = float(value)

    @property
    def good_steps(self) -> int:
        return int(self._device["tracker"].item()) if self._device is not None else self._good_steps

    @good_steps.setter
    def good_steps(self, value: int) -> None:
        self._to_host()
        self._good_steps = int(value)

    @property
    def skipped_steps(self) -> int:
        return int(self._device["skipped"].item()) if self._device is not None else self._skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._to_host()
        self._skipped_steps = int(value)

    def scale_for(self, device: torch.device) -> Union[float, torch.Tensor]:
        """The scale to multiply a loss on `device` by: the device tensor (0-dim float32) in device
        mode, else the host float. Never waits."""
        d = self._device
        if d is not None and d["scale"].device == device:
            # A copy: autograd saves it for the loss's backward, and update_on_device changes the
            # scale in place.
            return d["scale"].clone()
        return self.scale

    def inv_scale_tensor(self, device: torch.device) -> torch.Tensor:
        """1/scale as a 0-dim float64 tensor on `device`, for the unscale kernels (never waits)."""
        d = self._on(device)
        return torch.ones((), dtype=torch.float64, device=device).div(d["scale"].double())

    def _on(self, device: torch.device) -> dict:
        d = self._device
        if d is None or d["scale"].device != device:
            self._to_host()
            d = self._device = {
                "scale": torch.full((), self._scale, dtype=torch.float32, device=device),
                "tracker": torch.full((), self._good_steps, dtype=torch.int32, device=device),
                "skipped": torch.full((), self._skipped_steps, dtype=torch.int64, device=device)}
        return d

    # -- after a step ------------------------------------------------------------------------------
    def update(self, overflow: bool) -> None:
        """After a step: overflow means the step was skipped."""
        self._to_host()
        if overflow:
            self._skipped_steps += 1
        if not self.dynamic:
            return
        if overflow:
            if self._scale <= self.min_scale:
                warnings.warn(f"FP16_Optimizer: gradients overflow even at the minimum loss scale "
                              f"{self.min_scale:g}; steps keep being skipped (inf/nan in the loss "
                              "or the model, not a scaling problem?)", UserWarning, stacklevel=3)
            self._scale = max(self._scale * self.backoff_factor, self.min_scale)
            self._good_steps = 0
            return
        self._good_steps += 1
        if self._good_steps >= self.growth_interval:
            self._scale = min(self._scale * self.growth_factor, self.max_scale)
            self._good_steps = 0

    def update_on_device(self, found_inf: torch.Tensor) -> None:
        """update(), with the overflow flag (a one-element float32 tensor, nonzero: skipped) read
        where it is: nothing comes back to the host."""
        d = self._on(found_inf.device)
        d["skipped"].add_((found_inf.reshape(()) != 0).to(torch.int64))
        if not self.dynamic:
            return
        # It grows the scale when the tracker reaches the interval exactly; the host path's
        # count (>=) may already be past it (a smaller interval set, a loaded state).
        d["tracker"].clamp_(max=self.growth_interval - 1)
        torch._amp_update_scale_(d["scale"], d["tracker"], found_inf.reshape(()).float(),
                                 self.growth_factor, self.backoff_factor, self.growth_interval)
        d["scale"].clamp_(self.min_scale, self.max_scale)

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {name: getattr(self, name) for name in _FIELDS}

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - set(_FIELDS)
        if unknown:
            raise KeyError(f"loss scaler state has unknown keys {sorted(unknown)}")
        self._to_host()
        for name, value in state.items():
            setattr(self, name, value)
