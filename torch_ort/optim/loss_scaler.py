"""Dynamic loss scaling for fp16/bf16 training: the loss is multiplied by `scale` before backward
so small gradients survive fp16; a step whose gradients hold an inf or nan is skipped and the scale
shrinks (× backoff_factor, not below min_scale); after `growth_interval` clean steps in a row it
grows (× growth_factor, not above max_scale). A static scaler never changes its scale."""
from __future__ import annotations

import warnings


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
        self.scale = float(initial_scale)
        self.dynamic = dynamic
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.good_steps = 0       # clean steps since the last change of scale
        self.skipped_steps = 0    # steps skipped for overflow, in all

    def update(self, overflow: bool) -> None:
        """After a step: overflow means the step was skipped."""
        if overflow:
            self.skipped_steps += 1
        if not self.dynamic:
            return
        if overflow:
            if self.scale <= self.min_scale:
                warnings.warn(f"FP16_Optimizer: gradients overflow even at the minimum loss scale "
                              f"{self.min_scale:g}; steps keep being skipped (inf/nan in the loss "
                              "or the model, not a scaling problem?)", UserWarning, stacklevel=3)
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - set(self.__dict__)
        if unknown:
            raise KeyError(f"loss scaler state has unknown keys {sorted(unknown)}")
        self.__dict__.update(state)
