"""CTC loss in the engine's graph.

ATen's `_ctc_loss` returns, beside the loss, its forward variables (B, T, 2·max(target_lengths)+1):
a size read from the target lengths' values, which torch.export cannot propagate even with real
tensors ("DynamicOutputShapeException: aten._ctc_loss"), and torch.onnx has no translation. While
a module is exported, `F.ctc_loss` is therefore traced as `torch_ort::ctc_loss`, a library
operator whose output is the loss alone (its shape follows from the inputs' shapes). The engine
runs it as any library operator: through the dispatcher, ATen's own CTC kernels forward, and the
registered autograd below backward (ATen's CTC gradient, the forward variables recomputed). cuDNN's
CTC is never used: its gradient is not the one ATen's kernel and autograd compute (`transformers`
switches it off around its CTC losses for that reason).
"""
from __future__ import annotations

import contextlib
import threading

import torch

_REDUCTIONS = ("none", "mean", "sum")
_ctc_loss = torch.nn.functional.ctc_loss  # the stock function, whatever is patched later


def _loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    with torch.backends.cudnn.flags(enabled=False):
        return _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=blank,
                         reduction=_REDUCTIONS[reduction], zero_infinity=zero_infinity)


@torch.library.custom_op("torch_ort::ctc_loss", mutates_args=())
def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
             target_lengths: torch.Tensor, blank: int, reduction: int, zero_infinity: bool) -> torch.Tensor:
    """F.ctc_loss with its lengths as tensors and `reduction` an index into ('none', 'mean', 'sum')."""
    return _loss(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity).clone()


@ctc_loss.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    batched = log_probs.dim() == 3
    shape = (log_probs.shape[1],) if batched and reduction == 0 else ()
    return log_probs.new_empty(shape)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.options = inputs[4:]


def _backward(ctx, grad):
    log_probs, targets, input_lengths, target_lengths = ctx.saved_tensors
    with torch.enable_grad():
        leaf = log_probs.detach().requires_grad_()
        loss = _loss(leaf, targets, input_lengths, target_lengths, *ctx.options)
        (d_log_probs,) = torch.autograd.grad(loss, leaf, grad)
    return d_log_probs, None, None, None, None, None, None


ctc_loss.register_autograd(_backward, setup_context=_setup)


@contextlib.contextmanager
def ctc_loss_as_library_op():
    """While the exporting thread traces, F.ctc_loss is `torch_ort::ctc_loss` (other threads, and
    calls outside the block, get the stock function)."""
    functional = torch.nn.functional
    stock = functional.ctc_loss
    exporting = threading.get_ident()

    def traced(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
               zero_infinity=False):
        if threading.get_ident() != exporting or reduction not in _REDUCTIONS:
            return stock(log_probs, targets, input_lengths, target_lengths, blank=blank, reduction=reduction,
                         zero_infinity=zero_infinity)
        lengths = [torch.as_tensor(n, dtype=torch.long, device=log_probs.device)
                   if not isinstance(n, torch.Tensor) else n for n in (input_lengths, target_lengths)]
        return ctc_loss(log_probs, targets, *lengths, int(blank), _REDUCTIONS.index(reduction),
                        bool(zero_infinity))

    functional.ctc_loss = traced
    try:
        yield
    finally:
        functional.ctc_loss = stock
