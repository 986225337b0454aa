"""The shape family (csrc/core/ops/shape.cc): shapes, reshapes, slices, concatenation, padding, tiling."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


BIG = 2**63 - 1  # what the exporter writes for "to the end"
t = torch.tensor


def slice_grad_ref(shape, *index):
    def ref(dy, *_):
        z = torch.zeros(shape)
        z[index] = dy
        return z
    return ref


CASES = [
    Case("Reshape", [f(2, 3, 4), i64(0, -1)], lambda x, s: x.reshape(2, 12)),
    Case("Reshape", [f(2, 0, 4), i64(0, 8)], lambda x, s: x.reshape(0, 8), attrs=dict(allowzero=1),
         consts=(1,), id="Reshape-allowzero"),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(2, 12)),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(1, 24), attrs=dict(axis=0), id="Flatten-axis0"),
    Case("Flatten", [f(2, 3, 4)], lambda x: x.reshape(6, 4), attrs=dict(axis=-1), id="Flatten-neg"),
    Case("Transpose", [f(2, 3, 4)], lambda x: x.permute(2, 1, 0)),
    Case("Transpose", [f(2, 3, 4)], lambda x: x.permute(1, 0, 2), attrs=dict(perm=[1, 0, 2]), id="Transpose-perm"),
    Case("Constant", [], lambda: torch.arange(6.0).reshape(2, 3),
         attrs=dict(value=numpy_helper.from_array(torch.arange(6.0).reshape(2, 3).numpy()))),
    Case("Constant", [], lambda: torch.tensor(2.5), attrs=dict(value_float=2.5), id="Constant-float"),
    Case("Constant", [], lambda: i64(1, -1), attrs=dict(value_ints=[1, -1]), id="Constant-ints"),
    Case("Shape", [f(2, 3, 4)], lambda x: i64(2, 3, 4)),
    Case("Shape", [f(2, 3, 4)], lambda x: i64(3), attrs=dict(start=1, end=-1), id="Shape-slice"),
    Case("Size", [f(2, 3, 4)], lambda x: torch.tensor(24)),
    Case("Squeeze", [f(1, 3, 1, 2), i64(0)], lambda x, a: x.squeeze(0)),
    Case("Squeeze", [f(1, 3, 1, 2)], lambda x: x.reshape(3, 2), id="Squeeze-all"),
    Case("Unsqueeze", [f(3, 4), i64(0, -1)], lambda x, a: x.reshape(1, 3, 4, 1)),
    Case("Expand", [f(3, 1), i64(2, 1, 5)], lambda x, s: x.expand(2, 3, 5)),
    Case("Concat", [f(2, 1), f(2, 3), f(2, 2)], lambda *t: torch.cat(t, 1), attrs=dict(axis=1)),
    Case("Concat", [i64(1, 2), i64(3)], lambda *t: torch.cat(t), attrs=dict(axis=0), id="Concat-int64"),
    Case("ConstantOfShape", [i64(2, 3)], lambda s: torch.zeros(2, 3)),
    Case("ConstantOfShape", [i64(4)], lambda s: torch.full((4,), 7, dtype=torch.int64),
         attrs=dict(value=numpy_helper.from_array(i64(7).numpy())), id="ConstantOfShape-int64"),
    # --- Slice: constant or run-time bounds, clamping, negative / >1 steps, empty, opset-9 attributes
    Case("Slice", [f(4, 6), i64(1, -4), i64(3, 100), i64(0, 1), i64(1, 2)], lambda x, *_: x[1:3, 2::2],
         consts=(1, 2, 3, 4)),
    Case("Slice", [f(4, 6), i64(-3), i64(BIG), i64(1)], lambda x, *_: x[:, 3:], id="Slice-runtime-to-end"),
    Case("Slice", [f(5, 4), i64(-1), i64(-BIG - 1), i64(0), i64(-2)], lambda x, *_: x[t([4, 2, 0])],
         id="Slice-negative-step"),
    Case("Slice", [f(2, 3, 4), i64(BIG), i64(-BIG - 1), i64(-1), i64(-1)], lambda x, *_: x.flip(-1),
         consts=(1, 2, 3, 4), id="Slice-reverse"),
    Case("Slice", [i64(2, 3, 4, 5), i64(1), i64(3)], lambda x, *_: x[1:3], id="Slice-shape-vector"),
    Case("Slice", [f(4, 6), t([1], dtype=torch.int32), t([-1], dtype=torch.int32), t([1], dtype=torch.int32)],
         lambda x, *_: x[:, 1:-1], id="Slice-int32-bounds"),
    Case("Slice", [f(4, 3), i64(3), i64(1)], lambda x, *_: x[3:1], id="Slice-empty"),
    Case("Slice", [f(4, 6)], lambda x: x[1:3, 2:], attrs=dict(starts=[1, 2], ends=[3, 100], axes=[0, 1]),
         opset=9, id="Slice-opset9-attrs"),
    # --- Concat (with an empty part), Split (sizes input / run-time sizes / num_outputs / count / attr)
    Case("Concat", [f(2, 3), f(0, 3), f(1, 3)], lambda *x: torch.cat(x, 0), attrs=dict(axis=-2),
         id="Concat-empty-part"),
    Case("Split", [f(2, 7), i64(2, 5)], lambda x, s: torch.split(x, [2, 5], 1), attrs=dict(axis=1), n_out=2,
         consts=(1,)),
    Case("Split", [f(2, 7), i64(4, 3)], lambda x, s: torch.split(x, [4, 3], 1), attrs=dict(axis=-1), n_out=2,
         id="Split-runtime-sizes"),
    Case("Split", [f(7, 2)], lambda x: torch.split(x, 3, 0), attrs=dict(num_outputs=3), n_out=3,
         id="Split-num-outputs-uneven"),
    Case("Split", [f(6, 2)], lambda x: torch.chunk(x, 3, 0), n_out=3, id="Split-by-output-count"),
    Case("Split", [f(5, 2)], lambda x: torch.split(x, [1, 4], 0), attrs=dict(split=[1, 4]), opset=11, n_out=2,
         id="Split-opset11-attr"),
    # --- Tile, Trilu, Range
    Case("Tile", [f(2, 3), i64(2, 3)], lambda x, r: x.repeat(2, 3)),
    Case("Tile", [f(2, 1, 3), i64(1, 4, 1)], lambda x, r: x.repeat(1, 4, 1), consts=(1,), id="Tile-3d"),
    Case("Tile", [i64(1, 2), i64(3)], lambda x, r: x.repeat(3), id="Tile-int64"),
    # --- Pad: ONNX pads are (begins..., ends...) per axis; F.pad's are (begin, end) from the last dim
    Case("Pad", [f(3, 4), i64(0, 1, 0, 2), t(1.5)], lambda x, p, v: F.pad(x, (1, 2), value=1.5), consts=(1, 2)),
    Case("Pad", [f(3, 4), i64(0, -1, 1, 0)], lambda x, p: F.pad(x, (-1, 0, 0, 1)), consts=(1,), id="Pad-crop"),
    Case("Pad", [f(2, 3, 4), i64(2, 1), None, i64(-2)], lambda x, p, a: F.pad(x, (0, 0, 2, 1)), consts=(1, 3),
         id="Pad-axes"),
    Case("Pad", [f(2, 3, 5), i64(0, 0, 2, 0, 0, 1)], lambda x, p: F.pad(x, (2, 1), mode="reflect"),
         attrs=dict(mode="reflect"), consts=(1,), check_grad=False, id="Pad-reflect"),
    Case("Pad", [f(1, 2, 4, 4), i64(0, 0, 1, 1, 0, 0, 1, 1)], lambda x, p: F.pad(x, (1, 1, 1, 1), mode="replicate"),
         attrs=dict(mode="edge"), consts=(1,), check_grad=False, id="Pad-edge"),
    Case("Pad", [f(2, 3, 5), i64(0, 0, 1, 0, 0, 2)], lambda x, p: F.pad(x, (1, 2), mode="circular"),
         attrs=dict(mode="wrap"), consts=(1,), check_grad=False, id="Pad-wrap"),
    Case("Pad", [torch.ones(2, 3, dtype=torch.bool), i64(0, 1, 0, 0)], lambda x, p: F.pad(x, (1, 0)),
         consts=(1,), id="Pad-bool-mask"),
    Case("Pad", [f(3, 4)], lambda x: F.pad(x, (1, 0, 0, 2)), attrs=dict(pads=[0, 1, 2, 0]), opset=10,
         id="Pad-opset10-attr"),
    Case("Range", [t(0), t(7), t(2)], lambda *_: torch.arange(0, 7, 2)),
    Case("Range", [t(0.5), t(3.7), t(0.3)], lambda *_: torch.arange(0.5, 3.7, 0.3), id="Range-float"),
    Case("Range", [t(5), t(-3), t(-2)], lambda *_: torch.arange(5, -3, -2), id="Range-negative-delta"),
    Case("Range", [t(5), t(2), t(1)], lambda *_: torch.zeros(0, dtype=torch.int64), id="Range-empty"),
    Case("SliceGrad", [f(2, 2), i64(4, 6), i64(1, -4), i64(3, 100), i64(0, 1), i64(1, 2)],
         slice_grad_ref((4, 6), slice(1, 3), slice(2, None, 2)), domain=OURS),
    Case("SliceGrad", [f(3, 4), i64(5, 4), i64(-1), i64(-100), i64(0), i64(-2)],
         slice_grad_ref((5, 4), t([4, 2, 0])), domain=OURS, id="SliceGrad-negative-step"),
    Case("SplitGrad", [i64(2, 7), i64(2, 5), None, f(2, 5)], lambda s, sp, dy: torch.cat([torch.zeros(2, 2), dy], 1),
         attrs=dict(axis=1), domain=OURS, id="SplitGrad-missing-output-grad"),
    Case("SplitGrad", [i64(7, 2), None, f(3, 2), None, f(1, 2)],
         lambda s, a, c: torch.cat([a, torch.zeros(3, 2), c]), attrs=dict(num_outputs=3), domain=OURS),
    Case("ConcatGrad", [f(2, 6), i64(2, 1), i64(2, 3), i64(2, 2)], lambda dy, *_: torch.split(dy, [1, 3, 2], 1),
         attrs=dict(axis=1), n_out=3, domain=OURS),
    Case("TileGrad", [f(4, 9), i64(2, 3)], lambda dy, s: dy.reshape(2, 2, 3, 3).sum((0, 2)), domain=OURS),
]
