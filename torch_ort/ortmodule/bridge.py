"""The autograd bridge: one torch.autograd.Function whose inputs are the user tensors AND the
parameters, so PyTorch fills param.grad (and DDP's hooks fire) exactly as in eager."""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from torch_ort.ortmodule import python_op


class EngineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, engine, report, *inputs):
        """`report(phase)` or None: ORTMODULE_PRINT_MEMORY_STATS around backward."""
        with python_op.errors_as_raised():
            outputs, run_ctx = engine.forward(list(inputs))
        ctx.engine, ctx.report = engine, report
        # An output nobody differentiated gets None, not a filled zero tensor of its size (a GPT's
        # logits returned beside the loss: 200 MB); the engine uses a stride-0 zero view instead.
        ctx.set_materialize_grads(False)
        ctx.run_ctx = run_ctx  # holds only the saved set; freed by backward or with ctx
        frozen = [o for o, diff in zip(outputs, engine.output_differentiable) if not diff]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        run_ctx, ctx.run_ctx = ctx.run_ctx, None
        if run_ctx is None:
            raise RuntimeError("torch_ort: backward through the same ORTModule output twice; "
                               "pass retain_graph=True to the first backward is not supported")
        diff = ctx.engine.output_differentiable
        grads = [g if d else None for g, d in zip(grad_outputs, diff)]
        if ctx.report:
            ctx.report("pre-backward")
        with python_op.errors_as_raised():
            input_grads = ctx.engine.backward(run_ctx, grads)
        if ctx.report:
            ctx.report("post-backward")
        return (None, None, *_unalias(input_grads))


def _unalias(grads):
    """Two inputs may receive the very same gradient tensor (e.g. both operands of an Add);
    autograd must never store one tensor as two parameters' .grad."""
    seen = set()
    out = []
    for g in grads:
        if g is not None and g.layout == torch.strided:  # sparse gradients (ATen fallback) own theirs
            key = (g.data_ptr(), g.storage_offset(), tuple(g.shape), tuple(g.stride()))
            if g.numel() and key in seen:
                g = g.clone()
            seen.add(key)
        out.append(g)
    return out
