"""Autocast and export: the caller's autocast state is part of a graph's key (autocast_state), and
an export traces with that autocast entered inside the module's forward, with the float32 loss
rule CUDA autocast lacks."""
from __future__ import annotations

import contextlib
import functools

import torch

from torch_ort.ortmodule.export.workarounds import forward_replaced


def autocast_state(device_types) -> tuple:
    """(device type, dtype) per device type with autocast on: the export records autocast's casts,
    so a graph holds only under the state it was exported in (the engine itself runs with autocast
    off, csrc/runtime/executor.h)."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in sorted(device_types)
                 if torch.amp.is_autocast_available(d) and torch.is_autocast_enabled(d))


def float32_cross_entropy(self, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                          label_smoothing: float = 0.0):
    """The rule CUDA autocast lacks for aten::cross_entropy_loss (CPU autocast has it): inputs to
    float32, then the op with autocast off. Eager under CUDA autocast runs the op's decomposition,
    whose log_softmax and nll_loss are float32 ops, so it computes exactly this; without the rule
    a traced cross_entropy_loss stays whole and computes the loss in bf16/fp16."""
    def up(t):
        return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t

    with torch.autocast("cuda", enabled=False):
        return torch.ops.aten.cross_entropy_loss(up(self), up(target), up(weight), reduction, ignore_index,
                                                 label_smoothing)


_float32_rules = [0, None]  # (nesting depth, the torch.library.Library holding the rule)


@contextlib.contextmanager
def _cuda_autocast_float32_losses(state: tuple):
    """While an export traces under CUDA autocast, cross_entropy_loss has float32_cross_entropy as
    its AutocastCUDA kernel (registered once however deep exports nest; removed after)."""
    if not any(device == "cuda" for device, _ in state):
        yield
        return
    if _float32_rules[0] == 0:
        _float32_rules[1] = torch.library.Library("aten", "IMPL")
        _float32_rules[1].impl("cross_entropy_loss", float32_cross_entropy, "AutocastCUDA")
    _float32_rules[0] += 1
    try:
        yield
    finally:
        _float32_rules[0] -= 1
        if _float32_rules[0] == 0:
            _float32_rules[1] = None  # the Library's registrations die with it


@contextlib.contextmanager
def autocast_inside(module: torch.nn.Module, state: tuple):
    """The caller's autocast (`state`) entered inside the traced forward, and off around the
    exporter: its decompositions would otherwise re-apply autocast to a graph that already holds
    the casts (and break regions the model runs with autocast disabled)."""
    if not state:
        yield
        return
    forward = module.forward  # after attribute_reads: its recording forward

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with contextlib.ExitStack() as regions:
            for device, dtype in state:
                regions.enter_context(torch.autocast(device, dtype=dtype))
            return forward(*args, **kwargs)

    with contextlib.ExitStack() as off:
        off.enter_context(_cuda_autocast_float32_losses(state))
        for device, _ in state:
            off.enter_context(torch.autocast(device, enabled=False))
        off.enter_context(forward_replaced(module, autocast_forward))
        yield
