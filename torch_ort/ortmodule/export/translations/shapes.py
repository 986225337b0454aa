"""Translations of shape ops whose stock ONNX export does not compute what eager does.

- squeeze(dim): eager squeezes a dim only when its size is 1 and otherwise returns the tensor
  as it is; the stock export emits Squeeze for every named dim, which fails at run time on a dim
  of another size (`x.squeeze(1)` on a (B, 2, T) input). A dim of known size other than 1 is left
  alone here. A symbolic dim is squeezed as before: the export declares what torch decided for it,
  and the engine's shape inference refuses a graph whose Squeeze contradicts that declaration (the
  model then exports again with that dim held at its size, see shape_plans.SHAPE_PLANS).
"""
from __future__ import annotations

import torch
from onnxscript.onnx_opset import opset18 as op


def squeeze_dims(self, dim):
    """aten.squeeze.dim / aten.squeeze.dims."""
    rank = len(self.shape) if self.shape is not None else None
    if rank == 0:
        return op.Identity(self)
    dims = [dim] if isinstance(dim, int) else list(dim)
    if rank is None:
        return op.Squeeze(self, op.Constant(value_ints=dims))
    axes = []
    for d in sorted({d % rank for d in dims}):
        size = self.shape[d]
        if isinstance(size, int) and size != 1:
            continue  # eager leaves a dim of another size as it is
        axes.append(d)
    if not axes:
        return op.Identity(self)
    return op.Squeeze(self, op.Constant(value_ints=axes))


aten = torch.ops.aten
TRANSLATIONS = {
    aten.squeeze.dim: squeeze_dims,
    aten.squeeze.dims: squeeze_dims,
}
