"""Op cases of the indexing family: Gather*, Slice, Concat, Split, Tile, Pad, Trilu, Range,
CastLike, Max/Min, comparisons/logic, and the gradient ops their rules emit."""
import torch
import torch.nn.functional as F

from op_table import OURS, Case, f, i64

BIG = 2**63 - 1  # what the exporter writes for "to the end"
t = torch.tensor
_tie = f(3, 4)
_tie_b = torch.where(f(3, 4) > 0, _tie, _tie - 1)  # equal to _tie at about half the places
_row = f(4)


def minmax_grad(fn):
    """Reference for MinMaxGrad: autograd of torch.maximum/minimum (ties split between the two)."""
    def ref(dy, y, a, b):
        a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
        return torch.autograd.grad(fn(a, b), (a, b), dy)
    return ref


def slice_grad_ref(shape, *index):
    def ref(dy, *_):
        z = torch.zeros(shape)
        z[index] = dy
        return z
    return ref


CASES = [
    # --- Gather family: repeated and negative indices (backward must sum them)
    Case("Gather", [f(5, 3), i64(1, -1, 1, 0, 1)], lambda d, i: d[i % 5], id="Gather-repeated-neg"),
    Case("Gather", [f(10, 4), t([[1, 2, 1], [9, -1, 0]])], lambda d, i: torch.nn.functional.embedding(i % 10, d),
         id="Gather-embedding"),
    Case("Gather", [f(2, 3, 4), t([[0, 3], [3, -4]])], lambda d, i: d[:, :, i % 4], attrs=dict(axis=2),
         id="Gather-axis2-2d-idx"),
    Case("Gather", [f(6, 4, dtype=torch.float16), i64(1, 5, 1)], lambda d, i: d[i], id="Gather-f16"),
    Case("GatherElements", [f(3, 4), t([[0, 3], [3, -1], [1, 1]])], lambda d, i: torch.gather(d, 1, i % 4),
         attrs=dict(axis=1)),
    Case("GatherElements", [f(2, 3), t([[2, -1], [0, 0]], dtype=torch.int32)],
         lambda d, i: torch.gather(d, 1, i.long() % 3), attrs=dict(axis=1), id="GatherElements-int32-indices"),
    Case("GatherElements", [f(3, 4), t([[2, 0, -3], [2, 2, 1]])], lambda d, i: torch.gather(d, 0, i % 3),
         id="GatherElements-axis0-smaller"),
    Case("GatherND", [f(3, 4, 2), t([[0, 1], [2, -1], [0, 1]])], lambda d, i: d[i[:, 0] % 3, i[:, 1] % 4]),
    Case("GatherND", [f(3, 4), t([[[2], [0]], [[2], [-3]]])], lambda d, i: d[i[..., 0] % 3], id="GatherND-rows"),
    Case("GatherND", [f(2, 3, 4), t([[[0], [2]], [[1], [1]]])], lambda d, i: d[torch.arange(2)[:, None], i[..., 0]],
         attrs=dict(batch_dims=1), id="GatherND-batch-dims1"),
    Case("GatherND", [i64(4, 5, 6, 7).reshape(2, 2), t([[1, 0], [0, -1]])], lambda d, i: d[i[:, 0], i[:, 1] % 2],
         id="GatherND-int64"),
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
    Case("Trilu", [f(3, 4)], torch.triu),
    Case("Trilu", [f(2, 3, 4), t(-1)], lambda x, k: torch.tril(x, -1), attrs=dict(upper=0), id="Trilu-lower-k"),
    Case("Trilu", [f(4, 4), t(1)], lambda x, k: torch.triu(x, 1), consts=(1,), id="Trilu-upper-k-const"),
    Case("Trilu", [torch.ones(4, 4, dtype=torch.bool)], lambda x: torch.tril(x), attrs=dict(upper=0),
         id="Trilu-bool-causal-mask"),
    Case("Range", [t(0), t(7), t(2)], lambda *_: torch.arange(0, 7, 2)),
    Case("Range", [t(0.5), t(3.7), t(0.3)], lambda *_: torch.arange(0.5, 3.7, 0.3), id="Range-float"),
    Case("Range", [t(5), t(-3), t(-2)], lambda *_: torch.arange(5, -3, -2), id="Range-negative-delta"),
    Case("Range", [t(5), t(2), t(1)], lambda *_: torch.zeros(0, dtype=torch.int64), id="Range-empty"),
    # --- CastLike, Max/Min (ties split dY equally between two equal operands, as torch does)
    Case("CastLike", [f(3, 4), t(0.0, dtype=torch.float64)], lambda x, like: x.double()),
    Case("CastLike", [f(3, 4), t(0.0, dtype=torch.float16)], lambda x, like: x.half(), id="CastLike-f16"),
    Case("CastLike", [f(5) * 4, i64(0)], lambda x, like: x.long(), id="CastLike-to-int64"),
    Case("Max", [f(3, 4), f(4)], torch.maximum),
    Case("Max", [_tie, _tie_b], torch.maximum, id="Max-ties"),
    Case("Max", [f(3, 4), f(3, 1), f(4)], lambda a, b, c: torch.maximum(torch.maximum(a, b), c), id="Max-three"),
    Case("Max", [f(3)], lambda x: x, id="Max-one"),
    Case("Max", [i64(1, 5, 3), i64(4)], torch.maximum, id="Max-int64"),
    Case("Min", [f(2, 3), f(3)], torch.minimum),
    Case("Min", [_tie_b, _tie], torch.minimum, id="Min-ties"),
    # --- comparisons and logic (no gradient)
    Case("GreaterOrEqual", [i64(1, 2, 3), i64(2)], torch.ge),
    Case("GreaterOrEqual", [f(2, 3), f(3)], torch.ge, id="GreaterOrEqual-float"),
    Case("LessOrEqual", [i64(1, 2, 3), i64(2)], torch.le),
    Case("And", [f(2, 3) > 0, f(3) > 0], torch.logical_and),
    Case("Or", [f(2, 3) > 0, f(3) > 0], torch.logical_or),
    Case("Xor", [f(2, 3) > 0, f(2, 1) > 0], torch.logical_xor),
    Case("IsNaN", [t([1.0, float("nan"), float("inf"), -float("inf")])], torch.isnan),
    Case("IsInf", [t([1.0, float("nan"), float("inf"), -float("inf")])], torch.isinf),
    Case("IsInf", [t([1.0, float("inf"), -float("inf")])], torch.isposinf, attrs=dict(detect_negative=0),
         id="IsInf-positive-only"),
    Case("IsInf", [t([1.0, float("inf"), -float("inf")])], torch.isneginf, attrs=dict(detect_positive=0),
         id="IsInf-negative-only"),
    # --- our domain: gradient ops emitted by the rules above
    Case("GatherGrad", [f(4, 3), i64(5, 3), i64(1, -1, 1, 0)],
         lambda dy, s, i: torch.zeros(5, 3).index_add(0, i % 5, dy), domain=OURS),
    Case("GatherGrad", [f(2, 2, 2, 4), i64(2, 3, 4), t([[0, 2], [2, -1]])],
         lambda dy, s, i: torch.zeros(2, 3, 4).index_add(1, (i % 3).reshape(-1), dy.reshape(2, 4, 4)),
         attrs=dict(axis=1), domain=OURS, id="GatherGrad-axis1-2d"),
    Case("GatherElementsGrad", [f(3, 2), i64(3, 4), t([[0, 3], [3, -1], [1, 1]])],
         lambda dy, s, i: torch.zeros(3, 4).scatter_add(1, i % 4, dy), attrs=dict(axis=1), domain=OURS),
    Case("GatherNDGrad", [f(3, 2), i64(3, 4, 2), t([[0, 1], [2, -1], [0, 1]])],
         lambda dy, s, i: torch.zeros(3, 4, 2).index_put((i[:, 0], i[:, 1] % 4), dy, accumulate=True), domain=OURS),
    Case("GatherNDGrad", [f(2, 2, 4), i64(2, 3, 4), t([[[0], [0]], [[1], [2]]])],
         lambda dy, s, i: torch.zeros(2, 3, 4).index_put((torch.arange(2)[:, None], i[..., 0]), dy, accumulate=True),
         attrs=dict(batch_dims=1), domain=OURS, id="GatherNDGrad-batch-dims1"),
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
    Case("MinMaxGrad", [f(3, 4), torch.maximum(_tie, _tie_b), _tie, _tie_b], minmax_grad(torch.maximum),
         n_out=2, domain=OURS),
    Case("MinMaxGrad", [f(3, 4), torch.minimum(_tie, _row), _tie, _row], minmax_grad(torch.minimum),
         n_out=2, domain=OURS, id="MinMaxGrad-broadcast"),
]
